from services.trainer.feed import plan_release


def test_on_policy_releases_exactly_one_batch_for_the_current_version():
    assert plan_release(0, 0, 0, 1, 4, 100, released=0, replaced=0) == [0, 0, 0, 0]
    assert plan_release(0, 0, 0, 1, 4, 100, released=4, replaced=0) == []
    assert plan_release(1, 1, 0, 1, 4, 100, released=4, replaced=0) == [1, 1, 1, 1]


def test_staleness_bound_lets_prompts_run_eta_versions_ahead():
    # η = 2, a version every 2 steps: steps 0..5 train at versions 0..2
    assert plan_release(0, 0, 2, 2, 1, 100, released=0, replaced=0) == [0, 0, 1, 1, 2, 2]


def test_versions_follow_the_current_one_after_a_jump():
    # a resumed trainer whose version was moved past paramsync's latest (7 at step 4)
    assert plan_release(4, 7, 1, 1, 1, 100, released=4, replaced=0) == [7, 8]


def test_dropped_groups_are_replaced_and_the_run_length_caps_releases():
    assert plan_release(0, 0, 0, 1, 2, 100, released=2, replaced=1) == [0]
    assert len(plan_release(5, 5, 3, 1, 2, 6, released=0, replaced=0)) == 12
