"""The fuzzer's generated gRPC requests: reproducible from the seed, and really varied."""

from __future__ import annotations

import random

import pytest

from commands.fuzz.grpc_fuzz import HUGE_ELEMENTS, build_request
from commands.fuzz.grpc_targets import queue_methods
from commands.fuzz.messages import huge
from relayrl.v1 import trajectory_pb2 as tpb

pytestmark = pytest.mark.fuzz


def _requests(seed: int) -> list[tuple[str, list[bytes]]]:
    rng = random.Random(seed)
    return [build_request(random.Random(rng.getrandbits(64)), m) for m in queue_methods() for _ in range(50)]


def test_same_seed_same_requests_other_seed_other_requests():
    assert _requests(3) == _requests(3)
    assert _requests(3) != _requests(4)


def test_requests_cover_every_kind_and_break_array_lengths():
    push = next(m for m in queue_methods() if m.path.endswith("/Push"))
    kinds, mismatched = set(), 0
    for seed in range(400):
        kind, payload = build_request(random.Random(seed), push)
        kinds.add(kind)
        if kind in ("mutated", "random"):
            request = push.request.FromString(payload[0])
            trajectories: list[tpb.Trajectory] = [t for g in request.groups for t in g.trajectories]
            mismatched += any(len(t.behavior_logprobs) != len(t.response_token_ids) for t in trajectories)
    assert kinds == {"valid", "random", "mutated", "huge", "bytes"}
    assert mismatched > 10


def test_huge_requests_are_huge_in_count_not_in_the_fuzzers_memory():
    """A run of 10,000 calls sends hundreds of these; each must stay a few megabytes."""
    abandon = next(m for m in queue_methods() if m.path.endswith("/Abandon"))
    for seed in range(40):
        rng = random.Random(seed)
        (message,) = abandon.template(rng)
        grown = huge(rng, message, HUGE_ELEMENTS)
        grown_fields = (grown.lease_ids, grown.keep_lease_ids, grown.replica_id, grown.reason)
        assert max(len(field) for field in grown_fields) >= HUGE_ELEMENTS
        assert grown.ByteSize() < 64 * 2**20, seed
