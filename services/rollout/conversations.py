"""Conversations of the OpenAI endpoint, recorded token-exactly and pushed as trajectory groups.

A conversation is one episode in the multi-turn trajectory contract (``relayrl.schema.Sample``):
the first request's rendered prompt once, then each model turn's ids with their log-probs and
versions (loss mask 1), and between turns the ids of the messages the agent added (tool results,
user turns; loss mask 0, log-prob 0.0, the version of the model token before them). A turn is
added to the record only once the engine has answered it, so a failed request leaves the record
as it was.

A conversation ends when the agent finishes it (``POST /v1/conversations/{id}/finish``) with a reward,
or is abandoned after ``openai_conversation_idle_timeout_s`` without a request. Conversations that
share a ``group_id`` form one trajectory group of ``group_size`` members (one: a group of its own);
the group is pushed once every member is finished or abandoned (a group still short of members
when it has been idle as long is closed as well), with its finished members only. Abandoned
conversations are counted and never pushed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import OrderedDict
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

from relayrl.metrics import ServiceMetrics
from relayrl.retry import RetryPolicy, any_error, call_with_retries
from relayrl.schema import Group, Sample, validate_group
from relayrl.staleness import check_staleness
from services.rollout.openai_chat import ModelTurn
from services.rollout.openai_models import Message

log = logging.getLogger(__name__)

MAX_ENDED_IDS = 100_000


class ConversationConflict(Exception):
    """The request does not continue the conversation as recorded (answered 409)."""


class ConversationNotFound(Exception):
    """No open or finished conversation has this id (answered 404)."""


class GroupNotPushed(Exception):
    """The queue did not take a finished group within ``push_timeout_s`` (answered 503; counted)."""


class QueueSize(Protocol):
    queue_size: int


class GroupQueue(Protocol):
    async def push(self, groups: list[Group], timeout_s: float = 0.0) -> list[str]: ...

    async def stats(self) -> QueueSize: ...


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """What became of a group of conversations at this replica (``GET /v1/groups/{group_id}``).

    ``queued``: pushed to the queue as trajectory group ``trajectory_id`` (entry ``queue_entry_id``;
    ``queue_position`` is the number of groups in the queue right after the push, this one
    included: the trainer takes them in order). ``dropped``: never pushed, for ``reason`` (stale:
    already beyond the staleness bound; empty: every member abandoned; invalid; push_failed).
    Whether a queued group was then trained is the trainer's to say: ``relayrl ctl group``.
    """

    group_id: str
    status: str
    trajectory_id: str = ""
    reason: str = ""
    queue_entry_id: str = ""
    queue_position: int | None = None
    samples: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Conversation:
    conversation_id: str
    group_id: str
    group_size: int
    # The messages the record holds, in order: the prompt's, then each turn's new ones and answer.
    messages: list[Message] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    prompt_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    turn_ends: list[int] = field(default_factory=list)
    last_turn_ids: list[int] = field(default_factory=list)
    # The response decoded: model turns and the rendered messages between them.
    text: str = ""
    finish_reason: str = "stop"
    started_at_unix_s: float = field(default_factory=time.time)
    last_active: float = field(default_factory=time.monotonic)
    engine_s: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def started(self) -> bool:
        return bool(self.turn_ends)

    def new_messages(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> list[Message]:
        """What ``messages`` adds to the record; raises ConversationConflict when it does not continue it."""
        if tools != self.tools:
            raise ConversationConflict(
                f"conversation {self.conversation_id}: tools differ from its first request's"
                " (they are part of the recorded prompt)"
            )
        held = len(self.messages)
        if len(messages) <= held:
            raise ConversationConflict(
                f"conversation {self.conversation_id}: the request has {len(messages)} messages and adds none to"
                f" the {held} recorded (the last recorded one is the model's answer)"
            )
        for i, (sent, recorded) in enumerate(zip(messages, self.messages, strict=False)):
            if sent.key() != recorded.key():
                raise ConversationConflict(
                    f"conversation {self.conversation_id}: message {i} ({sent.role}) differs from the recorded"
                    f" {recorded.role} message; send the history exactly as answered (start a new conversation"
                    " id for another history)"
                )
        added = messages[held:]
        if any(m.role == "assistant" for m in added):
            raise ConversationConflict(
                f"conversation {self.conversation_id}: new messages may not include an assistant turn;"
                " the model's turns are the ones this endpoint answered"
            )
        return added

    def record(
        self, added: list[Message], observation_ids: list[int], turn: ModelTurn, answer: Message, text: str
    ) -> None:
        """Adds one answered request: its rendered new messages (masked), then the model's turn;
        ``text`` is both decoded."""
        if observation_ids:
            self.output_ids += observation_ids
            self.logprobs += [0.0] * len(observation_ids)
            self.versions += [self.versions[-1]] * len(observation_ids)
            self.loss_mask += [0] * len(observation_ids)
        self.output_ids += turn.ids
        self.logprobs += turn.logprobs
        self.versions += turn.versions
        self.loss_mask += [1] * len(turn.ids)
        self.turn_ends.append(len(self.output_ids))
        self.last_turn_ids = list(turn.ids)
        self.finish_reason = turn.finish_reason
        self.messages += [*added, answer]
        self.text += text
        self.last_active = time.monotonic()

    def sample(self, reward: float, replica_id: str, extra: dict[str, float], error: bool) -> Sample:
        # Single-turn recordings keep the single-turn encoding (empty mask and turn ends mean all ones).
        multi = len(self.turn_ends) > 1
        return Sample(
            prompt_token_ids=list(self.prompt_ids),
            response_token_ids=list(self.output_ids),
            behavior_logprobs=list(self.logprobs),
            policy_versions=list(self.versions),
            reward=reward,
            finish_reason=self.finish_reason,
            replica_id=replica_id,
            response_text=self.text,
            reward_extra={**extra, "episode/turns": float(len(self.turn_ends))},
            reward_error=error,
            started_at_unix_s=self.started_at_unix_s,
            finished_at_unix_s=time.time(),
            generation_s=self.engine_s,
            loss_mask=list(self.loss_mask) if multi else [],
            turn_ends=list(self.turn_ends) if multi else [],
        )


@dataclass
class _PendingGroup:
    group_id: str
    size: int
    samples: list[Sample] = field(default_factory=list)
    abandoned: int = 0
    data_source: str = ""
    ground_truth: str = ""
    extra_info: dict[str, Any] = field(default_factory=dict)
    last_active: float = field(default_factory=time.monotonic)

    def complete(self) -> bool:
        return len(self.samples) + self.abandoned >= self.size


class ConversationMetrics:
    def __init__(self, registry: ServiceMetrics) -> None:
        self.open = registry.gauge("openai_conversations_open", "Conversations of the OpenAI endpoint in progress.")
        self.ended = registry.counter(
            "openai_conversations",
            "Conversations of the OpenAI endpoint that ended, by outcome: finished, abandoned (idle timeout).",
            "total",
            labels=("outcome",),
        )
        self.groups = registry.counter(
            "openai_groups",
            "Trajectory groups of OpenAI conversations, by outcome: pushed, stale, empty (every member abandoned),"
            " invalid, push_failed.",
            "total",
            labels=("outcome",),
        )


class Conversations:
    """Every conversation of one replica; ``latest_version`` is the staleness reference at push time."""

    def __init__(
        self,
        queue: GroupQueue,
        metrics: ConversationMetrics,
        replica_id: str,
        idle_timeout_s: float,
        max_staleness: int,
        push_timeout_s: float,
        latest_version: Any,
    ) -> None:
        self._queue = queue
        self._metrics = metrics
        self._replica_id = replica_id
        self.idle_timeout_s = idle_timeout_s
        self._max_staleness = max_staleness
        self._push_timeout_s = push_timeout_s
        self._latest_version = latest_version
        self._open: dict[str, Conversation] = {}
        # Ids that ended (the newest MAX_ENDED_IDS), so a late request is told so instead of starting over.
        self._ended: OrderedDict[str, str] = OrderedDict()
        self._groups: dict[str, _PendingGroup] = {}
        # Groups closed here, the newest MAX_ENDED_IDS, by the agent's group id.
        self._closed: OrderedDict[str, GroupRecord] = OrderedDict()

    def group_status(self, group_id: str) -> dict[str, Any]:
        """A closed group's record, or how many members an open one still waits for."""
        if (record := self._closed.get(group_id)) is not None:
            return record.to_json()
        if (pending := self._groups.get(group_id)) is not None:
            waiting = max(pending.size - len(pending.samples) - pending.abandoned, 0)
            return {"group_id": group_id, "status": "waiting", "group_waiting_for": waiting}
        raise ConversationNotFound(f"no group {group_id} at this replica")

    def get_or_open(self, conversation_id: str, metadata: dict[str, Any]) -> Conversation:
        if conversation_id in self._ended:
            raise ConversationConflict(f"conversation {conversation_id} was {self._ended[conversation_id]}")
        conversation = self._open.get(conversation_id)
        if conversation is not None:
            return conversation
        group_id = str(metadata.get("group_id") or conversation_id)
        try:
            group_size = int(metadata.get("group_size") or 1)
        except (TypeError, ValueError):
            raise ValueError(f"metadata.group_size must be an integer, got {metadata.get('group_size')!r}") from None
        if group_size < 1:
            raise ValueError(f"metadata.group_size must be >= 1, got {group_size}")
        pending = self._groups.get(group_id)
        if pending is not None and pending.size != group_size:
            raise ValueError(f"group {group_id} has group_size {pending.size}; this request says {group_size}")
        self._groups.setdefault(group_id, _PendingGroup(group_id, group_size))
        conversation = Conversation(conversation_id, group_id, group_size)
        self._open[conversation_id] = conversation
        self._metrics.open.set(len(self._open))
        return conversation

    def drop_if_unstarted(self, conversation: Conversation) -> None:
        """A conversation whose first request failed is forgotten, so the agent may try it again."""
        if not conversation.started and self._open.get(conversation.conversation_id) is conversation:
            del self._open[conversation.conversation_id]
            self._metrics.open.set(len(self._open))
            group = self._groups.get(conversation.group_id)
            others = any(c.group_id == conversation.group_id for c in self._open.values())
            if group is not None and not group.samples and not group.abandoned and not others:
                del self._groups[conversation.group_id]

    async def finish(
        self, conversation_id: str, reward: float, extra: dict[str, float], error: bool, info: dict
    ) -> tuple[int, GroupRecord | None]:
        """Ends a conversation with its reward; returns how many members its group still waits for,
        and the group's record once it is closed."""
        conversation = self._open.get(conversation_id)
        if conversation is None:
            if conversation_id in self._ended:
                raise ConversationConflict(f"conversation {conversation_id} was {self._ended[conversation_id]}")
            raise ConversationNotFound(f"no conversation {conversation_id}")
        async with conversation.lock:
            if not conversation.started:
                raise ConversationConflict(f"conversation {conversation_id} has no answered turn to finish")
            self._end(conversation, "finished")
            sample = conversation.sample(reward, self._replica_id, extra, error)
        group = self._groups[conversation.group_id]
        group.samples.append(sample)
        group.last_active = time.monotonic()
        group.data_source = group.data_source or info.get("data_source", "")
        group.ground_truth = group.ground_truth or info.get("ground_truth", "")
        group.extra_info = group.extra_info or info.get("extra_info") or {}
        record = await self._close_group(group) if group.complete() else None
        return max(group.size - len(group.samples) - group.abandoned, 0), record

    def open_conversation(self, conversation_id: str) -> Conversation:
        conversation = self._open.get(conversation_id)
        if conversation is None:
            if conversation_id in self._ended:
                raise ConversationConflict(f"conversation {conversation_id} was {self._ended[conversation_id]}")
            raise ConversationNotFound(f"no conversation {conversation_id}")
        return conversation

    def _end(self, conversation: Conversation, outcome: str) -> None:
        del self._open[conversation.conversation_id]
        self._ended[conversation.conversation_id] = outcome
        while len(self._ended) > MAX_ENDED_IDS:
            self._ended.popitem(last=False)
        self._metrics.open.set(len(self._open))
        self._metrics.ended.labels(outcome=outcome).inc()

    async def sweep(self) -> None:
        """Abandons conversations idle past the timeout and closes groups that waited as long."""
        deadline = time.monotonic() - self.idle_timeout_s
        for conversation in list(self._open.values()):
            if conversation.last_active < deadline and not conversation.lock.locked():
                log.info("conversation %s abandoned after %gs idle", conversation.conversation_id, self.idle_timeout_s)
                self._end(conversation, "abandoned")
                group = self._groups[conversation.group_id]
                group.abandoned += 1
                if group.complete():
                    await self._close_group(group)
        waiting = {c.group_id for c in self._open.values()}
        for group in list(self._groups.values()):
            if group.group_id not in waiting and group.last_active < deadline:
                # Members that never arrived count as abandoned.
                await self._close_group(group)

    async def run_sweeps(self) -> None:
        while True:
            await asyncio.sleep(max(self.idle_timeout_s / 4, 0.05))
            # A group the queue would not take is logged and counted where it failed.
            with contextlib.suppress(GroupNotPushed):
                await self.sweep()

    async def _close_group(self, group: _PendingGroup) -> GroupRecord:
        del self._groups[group.group_id]
        record = await self._push_group(group)
        self._closed[group.group_id] = record
        while len(self._closed) > MAX_ENDED_IDS:
            self._closed.popitem(last=False)
        self._metrics.groups.labels(outcome=record.reason or "pushed").inc()
        if record.reason == "push_failed":
            raise GroupNotPushed(f"group {group.group_id}: the queue did not take it within {self._push_timeout_s:g}s")
        return record

    async def _push_group(self, group: _PendingGroup) -> GroupRecord:
        if not group.samples:
            return GroupRecord(group.group_id, "dropped", reason="empty")
        trajectory_group = Group(
            group_id=uuid.uuid4().hex,
            prompt_id=f"openai/{group.group_id}",
            samples=group.samples,
            data_source=group.data_source,
            ground_truth=group.ground_truth,
            extra_info=group.extra_info,
            created_at_unix_s=time.time(),
        )
        dropped = GroupRecord(group.group_id, "dropped", trajectory_group.group_id, samples=len(group.samples))
        verdict = check_staleness(trajectory_group.min_policy_version, self._latest_version(), self._max_staleness)
        if not verdict.ok:
            log.info(
                "group %s of OpenAI conversations is stale (age %s); dropped", group.group_id, verdict.age_versions
            )
            return replace(dropped, reason="stale")
        problems = validate_group(trajectory_group.to_proto())
        if problems:
            log.error("group %s of OpenAI conversations is malformed: %s", group.group_id, "; ".join(problems))
            return replace(dropped, reason="invalid")
        policy = RetryPolicy(attempts=None, deadline_s=self._push_timeout_s, first_wait_s=0.5, max_wait_s=2.0)
        try:
            (entry_id,) = await call_with_retries(
                f"push group {group.group_id}",
                lambda: self._queue.push([trajectory_group], timeout_s=self._push_timeout_s),
                any_error,
                policy,
                log,
            )
        except Exception as exc:
            log.error("group %s of OpenAI conversations could not be pushed: %r", group.group_id, exc)
            return replace(dropped, reason="push_failed")
        position = None
        with contextlib.suppress(Exception):  # the position is a hint; the push itself succeeded
            position = (await self._queue.stats()).queue_size
        log.info("group %s pushed as trajectory group %s", group.group_id, trajectory_group.group_id)
        return replace(dropped, status="queued", queue_entry_id=entry_id, queue_position=position)
