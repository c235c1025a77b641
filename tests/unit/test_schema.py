from relayrl.schema import Group, PromptSpec, Sample, validate_group
from relayrl.v1 import trajectory_pb2 as pb


def _sample(versions=(3, 3, 4)) -> Sample:
    n = len(versions)
    return Sample(
        prompt_token_ids=[1, 2, 3],
        response_token_ids=list(range(10, 10 + n)),
        behavior_logprobs=[-0.5] * n,
        policy_versions=list(versions),
        reward=1.0,
        finish_reason="length",
    )


def test_group_round_trip_keeps_versions_and_fields():
    group = Group("g1", "copy/7", [_sample(), _sample((5, 5, 5))], data_source="relayrl/copy", extra_info={"i": 7})
    msg = group.to_proto()
    assert (msg.min_policy_version, msg.max_policy_version) == (3, 5)
    back = Group.from_proto(msg)
    assert back.samples[0].finish_reason == "length"
    assert back.extra_info == {"i": 7}
    assert validate_group(msg) == []


def test_prompt_spec_round_trip_keeps_unset_overrides_unset():
    spec = PromptSpec("copy/1", [1, 2], n_samples=8, temperature=0.0, min_start_version=2)
    back = PromptSpec.from_proto(spec.to_proto())
    assert back.temperature == 0.0 and back.top_p is None and back.max_new_tokens is None
    assert back.min_start_version == 2


def test_mismatched_lengths_are_reported():
    msg = Group("g", "p", [_sample()]).to_proto()
    del msg.trajectories[0].behavior_logprobs[-1]
    assert any("behavior_logprobs" in p for p in validate_group(msg))


def test_header_versions_must_match_token_versions():
    msg = Group("g", "p", [_sample()]).to_proto()
    msg.min_policy_version = 9
    assert any("header versions" in p for p in validate_group(msg))


def test_empty_group_and_bad_json_are_reported():
    msg = Group("g", "p", [_sample()]).to_proto()
    msg.extra_info_json = "{not json"
    assert any("extra_info_json" in p for p in validate_group(msg))
    empty = Group("g", "p", [_sample()]).to_proto()
    del empty.trajectories[:]
    assert "group has no trajectories" in validate_group(empty)


def test_positive_logprob_is_reported():
    msg = Group("g", "p", [_sample()]).to_proto()
    msg.trajectories[0].behavior_logprobs[0] = 0.5
    assert any("<= 0" in p for p in validate_group(msg))


def _episode() -> Sample:
    # model 0-1 (v2), observation 2-3, model 4-5 (v4); turn 1 earned 0.25, the episode 1.0.
    return Sample(
        prompt_token_ids=[1, 2],
        response_token_ids=[10, 11, 50, 51, 12, 13],
        behavior_logprobs=[-0.125, -0.25, 0.0, 0.0, -0.375, -0.5],  # exact in float32
        policy_versions=[2, 2, 2, 2, 4, 4],
        reward=1.0,
        token_rewards=[0.0, 0.25, 0.0, 0.0, 0.0, 0.0],
        loss_mask=[1, 1, 0, 0, 1, 1],
        turn_ends=[2, 6],
    )


def test_episode_fields_survive_the_wire():
    msg = Group("g", "p", [_episode()]).to_proto()
    wire = pb.TrajectoryGroup.FromString(msg.SerializeToString())
    back = Group.from_proto(wire).samples[0]
    assert back == _episode()
    assert validate_group(wire) == []


def test_a_single_turn_sample_puts_no_episode_field_on_the_wire():
    names = {f.name for f, _ in _sample().to_proto().ListFields()}
    assert not names & {"loss_mask", "turn_ends"}
    assert Sample.from_proto(_sample().to_proto()).loss_mask == []


def test_group_versions_and_rewards_count_model_tokens_only():
    episode = _episode()
    episode.policy_versions[2:4] = [0, 0]  # observation tokens: sampled by no policy
    group = Group("g", "p", [episode])
    assert (group.min_policy_version, group.max_policy_version) == (2, 4)
    assert episode.model_versions == [2, 2, 4, 4]
    assert episode.total_reward == 1.25
    assert validate_group(group.to_proto()) == []


def test_an_observation_log_prob_is_refused_naming_the_field():
    episode = _episode()
    episode.behavior_logprobs[3] = -0.7
    problems = validate_group(Group("g", "p", [episode]).to_proto())
    assert problems == ["trajectory 0: behavior_logprobs must be 0.0 where loss_mask is 0; position 3 has -0.7"]
