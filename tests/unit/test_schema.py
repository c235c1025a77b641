from relayrl.schema import Group, PromptSpec, Sample, validate_group


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
