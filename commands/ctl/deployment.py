"""The deployment as ``relayrl ctl`` sees it: which components to act on, the status of each,
and the outcome of an action on each. A component that fails is reported, never fatal: the
others are still asked."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from commands.ctl.calls import CallError
from commands.ctl.components import (
    ParamsyncReport,
    PauseMode,
    QueueReport,
    ReplicaReport,
    RolloutControl,
    TrainerControl,
    TrainerReport,
    paramsync_status,
    queue_status,
)
from commands.ctl.config import CtlSettings

Component = Literal["rollout", "trainer", "queue", "paramsync"]
COMPONENTS: tuple[Component, ...] = ("rollout", "trainer", "queue", "paramsync")
# The settings variable that points at each component, for messages.
ENDPOINT_VARIABLE: dict[Component, str] = {
    "rollout": "RELAYRL_CTL_ROLLOUT_URLS",
    "trainer": "RELAYRL_CTL_TRAINER_URL",
    "queue": "RELAYRL_CTL_QUEUE_ADDRESS",
    "paramsync": "RELAYRL_CTL_PARAMSYNC_ADDRESS",
}
T = TypeVar("T")


@dataclass(frozen=True)
class Failure:
    component: Component | Literal["restarts"]
    endpoint: str
    cause: str


@dataclass
class DeploymentStatus:
    rollout: list[ReplicaReport] = field(default_factory=list)
    trainer: TrainerReport | None = None
    queue: QueueReport | None = None
    paramsync: ParamsyncReport | None = None
    failures: list[Failure] = field(default_factory=list)
    not_configured: list[Component] = field(default_factory=list)
    # Restarts per component of a local stack (its restarts.json), when RELAYRL_CTL_RESTARTS_FILE names one.
    restarts: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    component: Component
    endpoint: str
    ok: bool
    message: str


def configured(settings: CtlSettings, component: Component) -> bool:
    return bool(
        {
            "rollout": settings.rollout_urls,
            "trainer": settings.trainer_url,
            "queue": settings.queue_address,
            "paramsync": settings.paramsync_address,
        }[component]
    )


def _attempt(component: Component, call: Callable[[], T], failures: list[Failure]) -> T | None:
    try:
        return call()
    except CallError as exc:
        failures.append(Failure(component, exc.endpoint, exc.cause))
        return None


def gather_status(settings: CtlSettings, components: Sequence[Component] = COMPONENTS) -> DeploymentStatus:
    status = DeploymentStatus()
    token, timeout = settings.api_token, settings.timeout_s
    for component in components:
        if not configured(settings, component):
            status.not_configured.append(component)
    if "rollout" in components:
        for url in settings.rollout_urls:
            replica = _attempt("rollout", RolloutControl(url, token, timeout).status, status.failures)
            if replica is not None:
                status.rollout.append(replica)
    if "trainer" in components and settings.trainer_url:
        url = settings.trainer_url
        status.trainer = _attempt("trainer", TrainerControl(url, token, timeout).status, status.failures)
    if "queue" in components and settings.queue_address:
        address = settings.queue_address
        status.queue = _attempt("queue", lambda: queue_status(address, timeout), status.failures)
    if "paramsync" in components and settings.paramsync_address:
        address = settings.paramsync_address
        status.paramsync = _attempt("paramsync", lambda: paramsync_status(address, timeout), status.failures)
    if settings.restarts_file:
        try:
            status.restarts = json.loads(Path(settings.restarts_file).read_text())
        except (OSError, ValueError) as exc:
            status.failures.append(Failure("restarts", settings.restarts_file, str(exc)))
    return status


Action = Literal["pause", "resume", "checkpoint"]
# Which components each action applies to, in order: generation stops before the trainer stops
# consuming (so nothing new piles up behind a paused trainer), and the trainer resumes first.
ACTS_ON: dict[Action, tuple[Component, ...]] = {
    "pause": ("rollout", "trainer"),
    "resume": ("trainer", "rollout"),
    "checkpoint": ("trainer",),
}


def _describe_replica(replica: ReplicaReport) -> str:
    mode = f" ({replica.pause_mode})" if replica.paused and replica.pause_mode else ""
    return f"replica {replica.replica_id} is {'paused' + mode if replica.paused else 'running'}"


def act(
    settings: CtlSettings, action: Action, components: Sequence[Component], mode: PauseMode = "abort"
) -> list[Outcome]:
    """Applies ``action`` to each of ``components`` (in ``ACTS_ON`` order), one outcome per endpoint."""
    token, timeout = settings.api_token, settings.timeout_s
    outcomes: list[Outcome] = []
    for component in (c for c in ACTS_ON[action] if c in components):
        if not configured(settings, component):
            outcomes.append(Outcome(component, "", False, f"not configured: set {ENDPOINT_VARIABLE[component]}"))
            continue
        if component == "rollout":
            for url in settings.rollout_urls:
                control = RolloutControl(url, token, timeout)
                call: Callable[[], Any] = (lambda c=control: c.pause(mode)) if action == "pause" else control.resume
                outcomes.append(_run(component, url, call, _describe_replica))
        else:
            trainer = TrainerControl(settings.trainer_url, token, timeout)
            outcomes.append(_run(component, settings.trainer_url, getattr(trainer, action), _describe_trainer))
    return outcomes


def _describe_trainer(answer: dict[str, Any]) -> str:
    if "consuming" in answer:
        return "consuming trajectory groups" if answer["consuming"] else "stopped consuming after the current step"
    if answer.get("checkpoint_requested"):
        return "checkpoint requested: written at the next step that ends on a publish boundary"
    return ", ".join(f"{k}={v}" for k, v in answer.items())


def _run(component: Component, endpoint: str, call: Callable[[], T], describe: Callable[[T], str]) -> Outcome:
    try:
        return Outcome(component, endpoint, True, describe(call()))
    except CallError as exc:
        return Outcome(component, exc.endpoint, False, exc.cause)
