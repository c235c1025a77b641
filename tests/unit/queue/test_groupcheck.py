"""Validation from the wire bytes agrees with ``relayrl.schema.validate_group`` on every group."""

from __future__ import annotations

import random

import pytest
from google.protobuf.message import DecodeError

from relayrl.schema import Group, Sample, validate_group
from relayrl.v1 import trajectory_pb2 as pb
from services.queue.groupcheck import _fast_header, _slow_inspection, inspect_group


def _group(tokens: int = 5, version: int = 3) -> pb.TrajectoryGroup:
    samples = [
        Sample(
            prompt_token_ids=[7, 8, 9],
            response_token_ids=[100 + j * 997 for j in range(tokens)],
            behavior_logprobs=[-0.5 - j for j in range(tokens)],
            policy_versions=[version + j % 2 for j in range(tokens)],
            reward=1.0,
            token_rewards=[0.1] * tokens if i == 0 else [],
        )
        for i in range(2)
    ]
    return Group(group_id="g", prompt_id="p", samples=samples, extra_info={"k": 1}).to_proto()


def test_a_well_formed_group_passes_on_the_fast_path_with_its_header():
    payload = _group(tokens=5, version=200).SerializeToString()
    header = _fast_header(payload)
    assert header is not None
    assert (header.group_id, header.samples, header.response_tokens) == ("g", 2, 10)
    assert (header.min_policy_version, header.max_policy_version) == (200, 201)
    assert inspect_group(payload).header == header


def test_both_paths_give_each_samples_response_length_empty_responses_included():
    msg = _group(tokens=5)
    empty = msg.trajectories.add()
    empty.prompt_token_ids.extend([7, 8])
    payload = msg.SerializeToString()
    fast = _fast_header(payload)
    assert fast is not None and fast.response_lengths == (5, 5, 0)
    assert _slow_inspection(payload).header == fast


def _break(msg: pb.TrajectoryGroup, how: str) -> None:
    t = msg.trajectories[1]
    match how:
        case "no group id":
            msg.group_id = ""
        case "no trajectories":
            del msg.trajectories[:]
        case "extra info not an object":
            msg.extra_info_json = "[1]"
        case "extra info not json":
            msg.extra_info_json = "{"
        case "no prompt":
            del t.prompt_token_ids[:]
        case "short logprobs":
            del t.behavior_logprobs[-1]
        case "short versions":
            del t.policy_versions[-1]
        case "extra response token":
            t.response_token_ids.append(5)
        case "wrong token rewards":
            t.token_rewards.extend([0.0, 0.0])
        case "reward nan":
            t.reward = float("nan")
        case "positive logprob":
            t.behavior_logprobs[2] = 0.25
        case "infinite logprob":
            t.behavior_logprobs[0] = float("-inf")
        case "negative response id":
            t.response_token_ids[3] = -4
        case "negative prompt id":
            t.prompt_token_ids[0] = -1
        case "negative version":
            t.policy_versions[1] = -1
        case "header min version":
            msg.min_policy_version += 1
        case "header max version":
            msg.max_policy_version = 99
        case "no response tokens":
            for traj in msg.trajectories:
                del traj.response_token_ids[:], traj.behavior_logprobs[:], traj.policy_versions[:]
                del traj.token_rewards[:]
        case _:
            raise AssertionError(how)


BROKEN = [
    "no group id",
    "no trajectories",
    "extra info not an object",
    "extra info not json",
    "no prompt",
    "short logprobs",
    "short versions",
    "extra response token",
    "wrong token rewards",
    "reward nan",
    "positive logprob",
    "infinite logprob",
    "negative response id",
    "negative prompt id",
    "negative version",
    "header min version",
    "header max version",
    "no response tokens",
]


@pytest.mark.parametrize("how", BROKEN)
def test_each_broken_rule_is_refused_with_validate_groups_reasons(how):
    msg = _group()
    _break(msg, how)
    expected = validate_group(msg)
    assert expected, f"{how} is not a broken group to validate_group"
    found = inspect_group(msg.SerializeToString())
    assert found.header is None
    assert found.problems == expected


def test_an_unpacked_encoding_is_still_read_correctly():
    # Protobuf parsers must accept repeated scalars sent one element per tag; the view sees
    # them as unknown fields and hands the group to the slow path, which accepts it.
    msg = pb.TrajectoryGroup(group_id="g", min_policy_version=2, max_policy_version=2)
    prompt = b"\x08\x07"  # prompt_token_ids: 7, as one varint element
    response = b"\x10\x05\x10\x06"  # response_token_ids: 5, 6
    logprobs = b"\x1d" + b"\x00\x00\x00\xbf" + b"\x1d" + b"\x00\x00\x00\xbf"  # -0.5, -0.5
    versions = b"\x20\x02\x20\x02"
    trajectory = prompt + response + logprobs + versions
    payload = msg.SerializeToString() + b"\x1a" + bytes([len(trajectory)]) + trajectory
    assert _fast_header(payload) is None
    header = inspect_group(payload).header
    assert header is not None and header.response_tokens == 2 and header.min_policy_version == 2


def test_large_token_ids_take_the_slow_path_and_pass():
    msg = _group()
    msg.trajectories[0].response_token_ids[0] = 2**30
    payload = msg.SerializeToString()
    assert _fast_header(payload) is None
    assert inspect_group(payload).header is not None


def test_versions_of_mixed_varint_lengths_take_the_slow_path_and_pass():
    msg = _group(tokens=5, version=127)  # versions 127 (1 byte) and 128 (2 bytes)
    payload = msg.SerializeToString()
    assert _fast_header(payload) is None
    header = inspect_group(payload).header
    assert header is not None and (header.min_policy_version, header.max_policy_version) == (127, 128)


def test_garbage_does_not_decode():
    found = inspect_group(b"\x0a\xff\xff")
    assert found.header is None and "does not decode" in found.problems[0]


def test_a_corrupted_group_never_passes_unless_protobuf_and_validate_group_accept_it():
    rng = random.Random(7)
    clean = _group(tokens=6, version=130).SerializeToString()
    accepted = 0
    for _ in range(3000):
        data = bytearray(clean)
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(len(data))
            op = rng.random()
            if op < 0.6:
                data[pos] = rng.randrange(256)
            elif op < 0.8:
                del data[pos]
            else:
                data.insert(pos, rng.randrange(256))
        header = _fast_header(bytes(data))
        if header is None:
            continue
        accepted += 1
        try:
            msg = pb.TrajectoryGroup.FromString(bytes(data))
        except DecodeError:
            pytest.fail(f"fast path accepted bytes protobuf refuses: {bytes(data).hex()}")
        assert validate_group(msg) == []
        assert (header.min_policy_version, header.max_policy_version) == (
            msg.min_policy_version,
            msg.max_policy_version,
        )
        assert header.response_tokens == sum(len(t.response_token_ids) for t in msg.trajectories)
    # Many corruptions land in values that stay valid (a token id, a reward): those must pass.
    assert accepted > 100


# A two-turn episode of 10 response tokens: model 0-2, observation 3-5, model 6-9.
EPISODE_MASK = [1, 1, 1, 0, 0, 0, 1, 1, 1, 1]


def _episode_group(version: int = 3) -> pb.TrajectoryGroup:
    model = [m == 1 for m in EPISODE_MASK]
    samples = [
        Sample(
            prompt_token_ids=[7, 8, 9],
            response_token_ids=[100 + j * 997 for j in range(10)],
            behavior_logprobs=[-0.5 - j if m else 0.0 for j, m in enumerate(model)],
            # The second turn ran after a weight update; the observation keeps turn 1's version.
            policy_versions=[version] * 6 + [version + 1] * 4,
            reward=1.0,
            token_rewards=[0.5 if j == 2 else 0.0 for j in range(10)] if i == 0 else [],
            loss_mask=list(EPISODE_MASK),
            turn_ends=[3, 10],
        )
        for i in range(2)
    ]
    return Group(group_id="g", prompt_id="p", samples=samples).to_proto()


def test_a_well_formed_episode_passes_on_the_fast_path():
    payload = _episode_group(version=200).SerializeToString()
    header = _fast_header(payload)
    assert header is not None and (header.min_policy_version, header.max_policy_version) == (200, 201)
    assert header.response_lengths == (10, 10)
    assert _slow_inspection(payload).header == header


def test_an_old_version_on_an_observation_token_does_not_age_the_group():
    msg = _episode_group(version=5)
    for t in msg.trajectories:
        t.policy_versions[4] = 1  # no policy sampled it; staleness reads model tokens only
    payload = msg.SerializeToString()
    assert validate_group(msg) == []
    assert _fast_header(payload) is not None and _fast_header(payload).min_policy_version == 5
    msg.min_policy_version = 1
    assert (
        "header versions [1, 6] do not match model token versions [5, 6]"
        in inspect_group(msg.SerializeToString()).problems[0]
    )


def _break_episode(t: pb.Trajectory, how: str) -> None:
    match how:
        case "mask too short":
            del t.loss_mask[-1]
        case "mask value 2":
            t.loss_mask[0] = 2
        case "mask all zeros":
            t.loss_mask[:] = [0] * 10
        case "logprob on an observation":
            t.behavior_logprobs[4] = -0.3
        case "reward on an observation":
            t.token_rewards[:] = [0.0] * 10
            t.token_rewards[5] = 1.0
        case "turn ends not increasing":
            t.turn_ends[:] = [10, 3]
        case "turn end past the response":
            t.turn_ends[:] = [3, 11]
        case "turn end zero":
            t.turn_ends[:] = [0, 3, 10]
        case "turn end on an observation":
            t.turn_ends[:] = [4, 10]
        case "turn ends miss a turn":
            t.turn_ends[:] = [10]
        case "turn ends without mask":
            del t.loss_mask[:]
            t.behavior_logprobs[:] = [-0.5] * 10
            t.turn_ends[:] = [3]
        case _:
            raise AssertionError(how)


BROKEN_EPISODES = {
    "mask too short": "trajectory 1: 9 loss_mask for 10 response tokens",
    "mask value 2": "trajectory 1: loss_mask values must be 0 or 1",
    "mask all zeros": "trajectory 1: loss_mask is all zeros",
    "logprob on an observation": "trajectory 1: behavior_logprobs must be 0.0 where loss_mask is 0; position 4",
    "reward on an observation": "trajectory 1: token_rewards must be 0 where loss_mask is 0",
    "turn ends not increasing": "trajectory 1: turn_ends must be strictly increasing",
    "turn end past the response": "trajectory 1: turn_ends must lie in [1, 10]",
    "turn end zero": "trajectory 1: turn_ends must lie in [1, 10]",
    "turn end on an observation": "trajectory 1: turn_ends entry 4 does not end a model turn",
    "turn ends miss a turn": "trajectory 1: turn_ends lacks the model turn that ends at 3",
    # Without a mask every token is the model's: one turn, ending at 10.
    "turn ends without mask": "trajectory 1: turn_ends lacks the model turn that ends at 10",
}


@pytest.mark.parametrize("how", sorted(BROKEN_EPISODES))
def test_each_broken_episode_rule_is_refused_by_both_paths_naming_the_field(how):
    msg = _episode_group()
    _break_episode(msg.trajectories[1], how)
    expected = validate_group(msg)
    assert expected and expected[0].startswith(BROKEN_EPISODES[how])
    payload = msg.SerializeToString()
    assert _fast_header(payload) is None
    assert inspect_group(payload).problems == expected


def test_a_corrupted_episode_never_passes_unless_validate_group_accepts_it():
    rng = random.Random(11)
    clean = _episode_group(version=130).SerializeToString()
    accepted = 0
    for _ in range(2000):
        data = bytearray(clean)
        pos = rng.randrange(len(data))
        data[pos] = rng.randrange(256)
        header = _fast_header(bytes(data))
        if header is None:
            continue
        accepted += 1
        msg = pb.TrajectoryGroup.FromString(bytes(data))
        assert validate_group(msg) == []
        assert (header.min_policy_version, header.max_policy_version) == (
            msg.min_policy_version,
            msg.max_policy_version,
        )
    assert accepted > 100
