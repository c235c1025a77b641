"""``relayrl ctl group GROUP_ID``: what became of a group an agent finished through the OpenAI endpoint.

The answer is put together from the three services that each saw part of its life:

1. the rollout replica that recorded it (``GET /v1/groups/{id}``): still waiting for members,
   dropped before the push (stale, empty, invalid, push_failed), or pushed as trajectory group
   ``trajectory_id`` (queue entry ``queue_entry_id``);
2. the trainer (``GET /control/groups/{trajectory_id}``): trained at a step and version, or
   dropped by the trainer with a reason;
3. the queue (``GET /control/entries/{queue_entry_id}``), for a group the trainer has not taken:
   still queued, or dropped by the queue (stale at the trainer's version) with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import SecretStr

from commands.ctl.calls import CallError
from commands.ctl.config import CtlSettings
from relayrl import http_client


@dataclass(frozen=True)
class GroupReport:
    group_id: str
    # waiting | queued | trained | dropped | unknown
    status: str
    # Which component said so, and what it said.
    source: str
    detail: dict[str, Any] = field(default_factory=dict)
    # Components that could not be asked (endpoint: cause).
    failures: list[str] = field(default_factory=list)

    def line(self) -> str:
        d = self.detail
        if self.status == "trained":
            return f"group {self.group_id}: trained at step {d['step']} (version {d['version']})"
        if self.status == "dropped":
            return f"group {self.group_id}: dropped by the {self.source} ({d.get('reason')}{_detail(d)})"
        if self.status == "queued":
            where = (
                f"; {d['queue_position']} group(s) were queued when it was pushed" if d.get("queue_position") else ""
            )
            return f"group {self.group_id}: queued as {d.get('trajectory_id')}, not trained yet{where}"
        if self.status == "waiting":
            return f"group {self.group_id}: waiting for {d.get('group_waiting_for')} more member(s) to finish"
        return f"group {self.group_id}: unknown to {self.source}"


def _detail(d: dict[str, Any]) -> str:
    return f": {d['detail']}" if d.get("detail") else ""


def _get(url: str, token: SecretStr, timeout_s: float) -> dict[str, Any] | None:
    """The JSON answer of ``GET url``; None on 404."""
    headers = {"Authorization": f"Bearer {token.get_secret_value()}"} if token.get_secret_value() else {}
    try:
        response = http_client.get(url, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise CallError(f"GET {url}", f"unreachable ({exc or type(exc).__name__})") from None
    if response.status_code == httpx.codes.NOT_FOUND:
        return None
    if response.is_error:
        raise CallError(f"GET {url}", f"{response.status_code} {response.reason_phrase}: {response.text[:200]}")
    return response.json()


def find_group(settings: CtlSettings, group_id: str) -> GroupReport:
    token, timeout = settings.api_token, settings.timeout_s
    failures: list[str] = []
    record = None
    for url in settings.rollout_urls:
        try:
            record = _get(f"{url}/v1/groups/{group_id}", token, timeout)
        except CallError as err:
            failures.append(str(err))
            continue
        if record is not None:
            break
    if record is None:
        return GroupReport(group_id, "unknown", "the rollout replicas", failures=failures)
    if record["status"] != "queued":
        return GroupReport(group_id, record["status"], "rollout", record, failures)
    if settings.trainer_url:
        try:
            fate = _get(f"{settings.trainer_url}/control/groups/{record['trajectory_id']}", token, timeout)
        except CallError as err:
            failures.append(str(err))
        else:
            if fate is not None:
                return GroupReport(group_id, fate["status"], "trainer", {**record, **fate}, failures)
    if settings.queue_url and record.get("queue_entry_id"):
        try:
            entry = _get(f"{settings.queue_url}/control/entries/{record['queue_entry_id']}", token, timeout)
        except CallError as err:
            failures.append(str(err))
        else:
            if entry is not None and entry["status"] == "dropped":
                return GroupReport(group_id, "dropped", "queue", {**record, **entry}, failures)
    return GroupReport(group_id, "queued", "rollout", record, failures)
