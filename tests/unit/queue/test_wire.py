"""The byte-level Push/Pull codecs agree with protobuf's own encoding."""

from __future__ import annotations

import pytest

from relayrl.schema import Group, Sample
from relayrl.v1 import queue_pb2 as qpb
from services.queue.trajectories import Delivery, PullResult
from services.queue.wire import encode_pull_response, parse_push_request


def _group(i: int) -> Group:
    sample = Sample(
        prompt_token_ids=[1, 2],
        response_token_ids=list(range(300)),
        behavior_logprobs=[-0.25] * 300,
        policy_versions=[i] * 300,
        reward=0.5,
    )
    return Group(group_id=f"g{i}", prompt_id=f"p{i}", samples=[sample] * 3)


def test_push_request_splits_into_the_groups_bytes_and_the_timeout():
    groups = [_group(i).to_proto() for i in range(3)]
    request = qpb.PushRequest(groups=groups, timeout_s=2.5).SerializeToString()
    # A field from a newer client is skipped, not an error.
    request += b"\x18\x07"
    raw = parse_push_request(request)
    assert raw.timeout_s == 2.5
    assert [type(g).FromString(b) for g, b in zip(groups, raw.groups, strict=True)] == groups


@pytest.mark.parametrize("broken", [b"\x0a\x05abc", b"\x11\x00\x00", b"\x0a", b"\x0f"])
def test_broken_push_request_is_refused(broken):
    with pytest.raises(ValueError):
        parse_push_request(broken)


def test_pull_response_is_a_standard_encoding():
    groups = [_group(i).to_proto() for i in range(2)]
    deliveries = [Delivery(f"1-{i}", g.SerializeToString(), i + 1, 3 - i) for i, g in enumerate(groups)]
    decoded = qpb.PullResponse.FromString(encode_pull_response(PullResult(deliveries, dropped_stale=4)))
    expected = qpb.PullResponse(
        groups=[
            qpb.DeliveredGroup(entry_id=f"1-{i}", group=g, delivery_count=i + 1, age_versions=3 - i)
            for i, g in enumerate(groups)
        ],
        dropped_stale=4,
    )
    assert decoded == expected
