"""The stream entry header, prompt checks, lease ids and the sample-age window."""

from __future__ import annotations

from relayrl.schema import Group, Sample
from relayrl.v1 import trajectory_pb2 as pb
from services.queue.ages import AgeWindow
from services.queue.groupcheck import inspect_group
from services.queue.prompts import LEASE_ID, _prompt_problems
from services.queue.trajectories import entry_fields, payload_digest


def _group() -> pb.TrajectoryGroup:
    sample = Sample(
        prompt_token_ids=[1],
        response_token_ids=[2, 3],
        behavior_logprobs=[-0.1, -0.2],
        policy_versions=[4, 6],
        reward=1.0,
    )
    return Group(group_id="g", prompt_id="p", samples=[sample, sample], is_eval=True).to_proto()


def test_header_carries_versions_sizes_and_a_checksum_of_the_payload():
    msg = _group()
    received = msg.SerializeToString()
    header = inspect_group(received).header
    assert header is not None
    fields = entry_fields(header, received, now=123.5)
    v_min, v_max, gid, n, tokens, created, is_eval = (
        fields[k] for k in ("v_min", "v_max", "gid", "n", "tokens", "t", "eval")
    )
    digest, payload = fields["digest"], fields["payload"]
    assert (v_min, v_max, gid, n, tokens, is_eval) == (4, 6, "g", 2, 4, 1)
    # A group without a push time is stamped with the time the queue accepted it.
    assert float(created) == 123.5
    # The payload is stored byte for byte as received; the checksum also covers the staleness header.
    assert payload is received
    assert digest == payload_digest(received, 4) != payload_digest(received, 5)


def test_prompt_problems_name_each_bad_field():
    bad = pb.PromptGroup(prompt_id="", prompt_token_ids=[-1], n_samples=0, min_start_version=-2)
    problems = _prompt_problems(bad)
    assert len(problems) == 4
    assert _prompt_problems(pb.PromptGroup(prompt_id="p", prompt_token_ids=[1], n_samples=2)) == []


def test_lease_ids():
    assert LEASE_ID.match("000000000042.3").groups() == ("000000000042", "3")
    assert LEASE_ID.match("42.3") is None and LEASE_ID.match("000000000042") is None


def test_age_window_keeps_only_recent_deliveries():
    window = AgeWindow(size=2)
    assert window.summary().max_versions == 0.0
    for versions, seconds in [(9, 90.0), (1, 1.0), (3, 5.0)]:
        window.add(versions, seconds)
    summary = window.summary()
    assert (summary.avg_versions, summary.max_versions, summary.avg_s, summary.max_s) == (2.0, 3.0, 3.0, 5.0)
