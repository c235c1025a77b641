"""The staleness rule, written once and called by the trainer, the queue and the rollout.

RelayRL measures staleness in policy versions. With ``max_staleness = η``, a group consumed
by the trainer at version ``v`` must have been started by a policy of version at least
``v − η``. ``η = 0`` is synchronous, strictly on-policy training.

How the names users know map onto η:

- verl fully-async ``staleness_threshold`` / ``max_staleness_allowed``: η directly.
- AReaL ``max_head_offpolicyness``: η directly.
- ROLL ``async_generation_ratio``: generation may run that many *steps* ahead; with one
  weight sync per step (``sync_every = 1``) it equals η, otherwise η = ratio × sync_every.

η may change during a run (``max_staleness: auto``, :mod:`services.trainer.staleness_control`).
The bound is then the one in force when the work was *admitted*: the trainer stamps each released
prompt with its η (``PromptGroup.max_staleness``), the group answering it carries that η, and the
queue and the trainer judge the group by it (:func:`admitted_bound`). So a group consumed at
version ``v`` was started by a policy of version at least ``v − η_admitted``; a group admitted
legally is never dropped because η fell afterwards, and a rise of η widens only what is admitted
from then on. A group that carries no η (a producer that predates the field) is judged by the
consumer's current bound, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class Verdict(StrEnum):
    FRESH = "fresh"
    STALE = "stale"
    MISSING_VERSION = "missing_version"
    # Started by weights a trainer's resume discarded (see Rollback): trained on, it would pull the
    # policy back towards a branch that no longer exists.
    ROLLED_BACK = "rolled_back"


@dataclass(frozen=True, slots=True)
class StalenessCheck:
    verdict: Verdict
    # consumer version − oldest version that produced the group; None when unknown.
    age_versions: int | None

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.FRESH


def oldest_model_version(policy_versions: Sequence[int], loss_mask: Sequence[int]) -> int | None:
    """The oldest policy version among a sample's model tokens (``loss_mask`` 1; an empty mask
    is all ones); None when it has none. Observation tokens were sampled by no policy, so they
    never make a sample older than its model tokens are."""
    if not loss_mask:
        return min(policy_versions, default=None)
    return min((v for v, m in zip(policy_versions, loss_mask, strict=True) if m), default=None)


def oldest_allowed_version(consumer_version: int, max_staleness: int) -> int:
    """Lowest policy version whose samples may still be trained on at ``consumer_version``."""
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    return consumer_version - max_staleness


def check_staleness(min_policy_version: int | None, consumer_version: int, max_staleness: int) -> StalenessCheck:
    """Judges a group whose oldest contributing policy is ``min_policy_version``.

    A group with no version (``None`` or negative) cannot prove it is fresh, so it is
    treated as stale with its own verdict: it must never be trained on.
    """
    floor = oldest_allowed_version(consumer_version, max_staleness)
    if min_policy_version is None or min_policy_version < 0:
        return StalenessCheck(Verdict.MISSING_VERSION, None)
    age = consumer_version - min_policy_version
    if min_policy_version < floor:
        return StalenessCheck(Verdict.STALE, age)
    return StalenessCheck(Verdict.FRESH, age)


def admitted_bound(admitted: int | None, current: int) -> int:
    """The η a group is judged by: the one its prompt was admitted under, else the consumer's ``current``."""
    return current if admitted is None else admitted


def min_start_version(train_version: int, max_staleness: int) -> int:
    """Lowest policy version allowed to start a prompt that will be trained at ``train_version``.

    The trainer stamps this on each released prompt so that no replica begins work that the
    staleness check would later drop.
    """
    return max(0, oldest_allowed_version(train_version, max_staleness))


@dataclass(frozen=True, slots=True)
class Rollback:
    """A trainer resumed from its checkpoint at ``checkpoint_version`` K and went on as
    ``resumed_version`` R >= K: the versions K < v < R it had published since were made by weights
    the crash lost, and R holds K's weights again.

    Versions only move forward, so R is a new number (one past the newest paramsync holds) and
    no replica ever loads an older version. Staleness is measured along the trainer's lineage,
    the chain of weights the final model descends from: K..R adds no step to a group's age, so
    a group started at K is as fresh at R as it was at K; a group started at K < v < R comes from
    a discarded branch and is never trained on (:data:`Verdict.ROLLED_BACK`).
    """

    checkpoint_version: int
    resumed_version: int


def _skipped(rollbacks: Sequence[Rollback]) -> list[tuple[int, int]]:
    """The version ranges [K + 1, R] (merged, sorted) that add no step along the lineage."""
    spans = sorted(
        (r.checkpoint_version + 1, r.resumed_version) for r in rollbacks if r.resumed_version > r.checkpoint_version
    )
    merged: list[tuple[int, int]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return merged


def lineage_version(min_policy_version: int, rollbacks: Sequence[Rollback]) -> int | None:
    """The number that, counted after the rollbacks, is as many lineage steps back as
    ``min_policy_version`` is: a consumer at version u judges the group by u − this. None when
    the group was started by discarded weights."""
    if any(r.checkpoint_version < min_policy_version < r.resumed_version for r in rollbacks):
        return None
    above = (hi - max(lo, min_policy_version + 1) + 1 for lo, hi in _skipped(rollbacks) if hi > min_policy_version)
    return min_policy_version + sum(above)


def rollbacks_from_pairs(pairs: Sequence[Sequence[int]]) -> tuple[Rollback, ...]:
    """Rollbacks from (checkpoint_version, resumed_version) pairs, as a checkpoint or Redis keeps them."""
    return tuple(Rollback(int(k), int(r)) for k, r in pairs)
