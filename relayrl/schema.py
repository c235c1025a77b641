"""Typed views of the wire messages that several services handle, and their validation.

Services convert ``relayrl.v1`` messages to these dataclasses at their edge and pass the
dataclasses inward. :func:`validate_group` is the one definition of a well-formed
trajectory group: the rollout checks before pushing, the queue dead-letters what fails it.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from relayrl.staleness import oldest_model_version
from relayrl.v1 import trajectory_pb2 as pb

FINISH_REASONS = {
    "stop": pb.FINISH_REASON_STOP,
    "length": pb.FINISH_REASON_LENGTH,
    "abort": pb.FINISH_REASON_ABORT,
}
FINISH_REASON_NAMES = {v: k for k, v in FINISH_REASONS.items()}


@dataclass(slots=True)
class Sample:
    """One generated response with everything the trainer needs from it.

    A multi-turn episode is one sample: ``response_token_ids`` is everything after the first
    prompt (model turns and the observations between them), ``loss_mask`` marks the model's
    tokens (empty: all of them) and ``turn_ends`` where each model turn ends. The per-token
    lists all have the response's length; see ``Trajectory`` in trajectory.proto.
    """

    prompt_token_ids: list[int]
    response_token_ids: list[int]
    behavior_logprobs: list[float]
    policy_versions: list[int]
    reward: float
    finish_reason: str = "stop"
    token_rewards: list[float] = field(default_factory=list)
    replica_id: str = ""
    response_text: str = ""
    reward_extra: dict[str, float] = field(default_factory=dict)
    reward_error: bool = False
    started_at_unix_s: float = 0.0
    finished_at_unix_s: float = 0.0
    generation_s: float = 0.0
    reward_s: float = 0.0
    # Multi-turn episodes: 1 on model tokens, 0 on observation tokens; empty means all ones.
    loss_mask: list[int] = field(default_factory=list)
    # One past the last model token of each model turn, indexes into response_token_ids; empty: single turn.
    turn_ends: list[int] = field(default_factory=list)

    @property
    def model_versions(self) -> list[int]:
        """The policy versions of the model's tokens (observation tokens left out)."""
        if not self.loss_mask:
            return list(self.policy_versions)
        return [v for v, m in zip(self.policy_versions, self.loss_mask, strict=True) if m]

    @property
    def total_reward(self) -> float:
        """The episode's return: the final ``reward`` plus every per-turn reward."""
        return self.reward + sum(self.token_rewards)

    def to_proto(self) -> pb.Trajectory:
        return pb.Trajectory(
            prompt_token_ids=self.prompt_token_ids,
            response_token_ids=self.response_token_ids,
            behavior_logprobs=self.behavior_logprobs,
            policy_versions=self.policy_versions,
            reward=self.reward,
            token_rewards=self.token_rewards,
            finish_reason=FINISH_REASONS.get(self.finish_reason, pb.FINISH_REASON_UNSPECIFIED),
            replica_id=self.replica_id,
            response_text=self.response_text,
            reward_extra=self.reward_extra,
            reward_error=self.reward_error,
            timings=pb.SampleTimings(
                started_at_unix_s=self.started_at_unix_s,
                finished_at_unix_s=self.finished_at_unix_s,
                generation_s=self.generation_s,
                reward_s=self.reward_s,
            ),
            loss_mask=self.loss_mask,
            turn_ends=self.turn_ends,
        )

    @classmethod
    def from_proto(cls, msg: pb.Trajectory) -> Sample:
        return cls(
            prompt_token_ids=list(msg.prompt_token_ids),
            response_token_ids=list(msg.response_token_ids),
            behavior_logprobs=list(msg.behavior_logprobs),
            policy_versions=list(msg.policy_versions),
            reward=msg.reward,
            finish_reason=FINISH_REASON_NAMES.get(msg.finish_reason, "unspecified"),
            token_rewards=list(msg.token_rewards),
            replica_id=msg.replica_id,
            response_text=msg.response_text,
            reward_extra=dict(msg.reward_extra),
            reward_error=msg.reward_error,
            started_at_unix_s=msg.timings.started_at_unix_s,
            finished_at_unix_s=msg.timings.finished_at_unix_s,
            generation_s=msg.timings.generation_s,
            reward_s=msg.timings.reward_s,
            loss_mask=list(msg.loss_mask),
            turn_ends=list(msg.turn_ends),
        )


@dataclass(slots=True)
class Group:
    """The ``n`` samples of one prompt."""

    group_id: str
    prompt_id: str
    samples: list[Sample]
    data_source: str = ""
    ground_truth: str = ""
    extra_info: dict[str, Any] = field(default_factory=dict)
    lease_id: str = ""
    created_at_unix_s: float = 0.0
    is_eval: bool = False
    # The η its prompt was admitted under (PromptSpec.max_staleness); None: the consumer's bound.
    max_staleness: int | None = None

    @classmethod
    def answering(cls, prompt: PromptSpec, samples: list[Sample], lease_id: str) -> Group:
        """The group of ``samples`` generated for ``prompt`` under ``lease_id``, with a new id: it
        carries the prompt's identity, source, ground truth and extra info to the trainer."""
        return cls(
            group_id=uuid.uuid4().hex,
            prompt_id=prompt.prompt_id,
            samples=samples,
            data_source=prompt.data_source,
            ground_truth=prompt.ground_truth,
            extra_info=prompt.extra_info,
            lease_id=lease_id,
            created_at_unix_s=time.time(),
            is_eval=prompt.is_eval,
            max_staleness=prompt.max_staleness,
        )

    @property
    def min_policy_version(self) -> int:
        """The oldest policy behind any model token of the group: what staleness is judged on."""
        oldest = [oldest_model_version(s.policy_versions, s.loss_mask) for s in self.samples]
        return min(v for v in oldest if v is not None)

    @property
    def max_policy_version(self) -> int:
        return max(v for s in self.samples for v in s.model_versions)

    def to_proto(self) -> pb.TrajectoryGroup:
        return pb.TrajectoryGroup(
            group_id=self.group_id,
            prompt_id=self.prompt_id,
            trajectories=[s.to_proto() for s in self.samples],
            data_source=self.data_source,
            ground_truth=self.ground_truth,
            extra_info_json=json.dumps(self.extra_info),
            min_policy_version=self.min_policy_version,
            max_policy_version=self.max_policy_version,
            lease_id=self.lease_id,
            created_at_unix_s=self.created_at_unix_s,
            is_eval=self.is_eval,
            max_staleness=self.max_staleness,
        )

    @classmethod
    def from_proto(cls, msg: pb.TrajectoryGroup) -> Group:
        return cls(
            group_id=msg.group_id,
            prompt_id=msg.prompt_id,
            samples=[Sample.from_proto(t) for t in msg.trajectories],
            data_source=msg.data_source,
            ground_truth=msg.ground_truth,
            extra_info=json.loads(msg.extra_info_json) if msg.extra_info_json else {},
            lease_id=msg.lease_id,
            created_at_unix_s=msg.created_at_unix_s,
            is_eval=msg.is_eval,
            max_staleness=msg.max_staleness if msg.HasField("max_staleness") else None,
        )


@dataclass(slots=True)
class PromptSpec:
    """A prompt released by the trainer for generation."""

    prompt_id: str
    prompt_token_ids: list[int]
    n_samples: int
    data_source: str = ""
    ground_truth: str = ""
    extra_info: dict[str, Any] = field(default_factory=dict)
    min_start_version: int = 0
    released_at_version: int = 0
    released_at_unix_s: float = 0.0
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_new_tokens: int | None = None
    is_eval: bool = False
    # η in force when the trainer admitted the prompt; the group answering it is judged by it.
    max_staleness: int | None = None

    def to_proto(self) -> pb.PromptGroup:
        sampling = pb.SamplingOverrides()
        for name in ("temperature", "top_p", "top_k", "max_new_tokens"):
            value = getattr(self, name)
            if value is not None:
                setattr(sampling, name, value)
        return pb.PromptGroup(
            prompt_id=self.prompt_id,
            prompt_token_ids=self.prompt_token_ids,
            n_samples=self.n_samples,
            data_source=self.data_source,
            ground_truth=self.ground_truth,
            extra_info_json=json.dumps(self.extra_info),
            min_start_version=self.min_start_version,
            released_at_version=self.released_at_version,
            released_at_unix_s=self.released_at_unix_s,
            sampling=sampling,
            is_eval=self.is_eval,
            max_staleness=self.max_staleness,
        )

    @classmethod
    def from_proto(cls, msg: pb.PromptGroup) -> PromptSpec:
        sampling = msg.sampling

        def opt(name: str) -> Any:
            return getattr(sampling, name) if sampling.HasField(name) else None

        return cls(
            prompt_id=msg.prompt_id,
            prompt_token_ids=list(msg.prompt_token_ids),
            n_samples=msg.n_samples,
            data_source=msg.data_source,
            ground_truth=msg.ground_truth,
            extra_info=json.loads(msg.extra_info_json) if msg.extra_info_json else {},
            min_start_version=msg.min_start_version,
            released_at_version=msg.released_at_version,
            released_at_unix_s=msg.released_at_unix_s,
            temperature=opt("temperature"),
            top_p=opt("top_p"),
            top_k=opt("top_k"),
            max_new_tokens=opt("max_new_tokens"),
            is_eval=msg.is_eval,
            max_staleness=msg.max_staleness if msg.HasField("max_staleness") else None,
        )


def validate_group(msg: pb.TrajectoryGroup) -> list[str]:
    """Every reason ``msg`` is not a trainable group; empty when it is well formed.

    Runs on every push of every group, so per-token checks are vectorised with numpy.
    """
    problems: list[str] = []
    if not msg.group_id:
        problems.append("group_id is empty")
    if not msg.trajectories:
        problems.append("group has no trajectories")
    if msg.HasField("max_staleness") and msg.max_staleness < 0:
        problems.append(f"max_staleness must be >= 0, got {msg.max_staleness}")
    if msg.extra_info_json:
        try:
            if not isinstance(json.loads(msg.extra_info_json), dict):
                problems.append("extra_info_json is not a JSON object")
        except json.JSONDecodeError as exc:
            problems.append(f"extra_info_json is not valid JSON: {exc.msg}")
    low, high = None, None
    for i, traj in enumerate(msg.trajectories):
        problems.extend(f"trajectory {i}: {p}" for p in _trajectory_problems(traj))
        versions = np.asarray(traj.policy_versions, dtype=np.int64)
        if traj.loss_mask and len(traj.loss_mask) == versions.size:
            versions = versions[np.asarray(traj.loss_mask, dtype=np.int64) != 0]
        if versions.size:
            low = int(versions.min()) if low is None else min(low, int(versions.min()))
            high = int(versions.max()) if high is None else max(high, int(versions.max()))
    if problems or not msg.trajectories:
        return problems
    if low is None:
        return ["no response tokens in any trajectory"]
    if (msg.min_policy_version, msg.max_policy_version) != (low, high):
        problems.append(
            f"header versions [{msg.min_policy_version}, {msg.max_policy_version}] do not match"
            f" model token versions [{low}, {high}]"
        )
    return problems


def _trajectory_problems(traj: pb.Trajectory) -> list[str]:
    problems: list[str] = []
    n = len(traj.response_token_ids)
    if not traj.prompt_token_ids:
        problems.append("prompt_token_ids is empty")
    for name in ("behavior_logprobs", "policy_versions"):
        if len(getattr(traj, name)) != n:
            problems.append(f"{len(getattr(traj, name))} {name} for {n} response tokens")
    if traj.token_rewards and len(traj.token_rewards) != n:
        problems.append(f"{len(traj.token_rewards)} token_rewards for {n} response tokens")
    if not math.isfinite(traj.reward):
        problems.append("reward is not finite")
    logprobs = np.asarray(traj.behavior_logprobs, dtype=np.float64)
    if logprobs.size and not (np.isfinite(logprobs).all() and (logprobs <= 0).all()):
        problems.append("behavior_logprobs must be finite and <= 0")
    for name in ("response_token_ids", "prompt_token_ids"):
        ids = np.asarray(getattr(traj, name), dtype=np.int64)
        if ids.size and ids.min() < 0:
            problems.append("negative token id")
            break
    versions = np.asarray(traj.policy_versions, dtype=np.int64)
    if versions.size and versions.min() < 0:
        problems.append("negative policy version")
    mask = np.asarray(traj.loss_mask, dtype=np.int64)
    problems.extend(loss_mask_problems(mask, n))
    if mask.size == n and not problems:
        problems.extend(_observation_problems(traj, mask == 0))
    problems.extend(turn_ends_problems(np.asarray(traj.turn_ends, dtype=np.int64), mask, n))
    return problems


def loss_mask_problems(mask: np.ndarray, n: int) -> list[str]:
    """Why ``mask`` is not the loss mask of ``n`` response tokens (empty stands for all ones)."""
    if not mask.size:
        return []
    if mask.size != n:
        return [f"{mask.size} loss_mask for {n} response tokens"]
    if ((mask != 0) & (mask != 1)).any():
        return ["loss_mask values must be 0 or 1"]
    if not mask.any():
        return ["loss_mask is all zeros: no model token to train on"]
    return []


def _observation_problems(traj: pb.Trajectory, observed: np.ndarray) -> list[str]:
    """Observation tokens were not sampled: nothing may claim a log-prob or a reward for them."""
    problems = []
    logprobs = np.asarray(traj.behavior_logprobs, dtype=np.float64)
    if (logprobs[observed] != 0).any():
        at = int(np.flatnonzero(observed & (logprobs != 0))[0])
        problems.append(f"behavior_logprobs must be 0.0 where loss_mask is 0; position {at} has {logprobs[at]:g}")
    rewards = np.asarray(traj.token_rewards, dtype=np.float64)
    if rewards.size and (rewards[observed] != 0).any():
        at = int(np.flatnonzero(observed & (rewards != 0))[0])
        problems.append(
            f"token_rewards must be 0 where loss_mask is 0 (a turn's reward sits on its last token); position {at}"
        )
    return problems


def turn_ends_problems(turn_ends: np.ndarray, mask: np.ndarray, n: int) -> list[str]:
    """Why ``turn_ends`` are not the ends of the model turns under ``mask`` (empty: all ones).

    Each end must close a model turn (its last token is a model token), and every model turn
    must have its end: a run of model tokens that stops where an observation (or the response)
    begins. Two turns may meet without an observation between them (an empty one).
    """
    if not turn_ends.size:
        return []
    if (np.diff(turn_ends) <= 0).any():
        return ["turn_ends must be strictly increasing"]
    if turn_ends[0] < 1 or turn_ends[-1] > n:
        return [f"turn_ends must lie in [1, {n}], got [{int(turn_ends[0])}, {int(turn_ends[-1])}]"]
    if not mask.size:
        model = np.ones(n, dtype=bool)
    elif loss_mask_problems(mask, n):
        return []
    else:
        model = mask != 0
    if not model[turn_ends - 1].all():
        at = int(turn_ends[~model[turn_ends - 1]][0])
        return [f"turn_ends entry {at} does not end a model turn: loss_mask[{at - 1}] is 0"]
    ends = np.flatnonzero(model & ~np.append(model[1:], False)) + 1
    missing = np.setdiff1d(ends, turn_ends)
    if missing.size:
        return [f"turn_ends lacks the model turn that ends at {int(missing[0])}"]
    return []
