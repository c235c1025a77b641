from relayrl.metrics import key_to_metric_name


def test_a_key_under_the_services_own_name_is_not_named_twice():
    assert key_to_metric_name("trainer", "trainer/global_steps") == "relayrl_trainer_global_steps"
    assert key_to_metric_name("trainer", "actor/pg_loss") == "relayrl_trainer_actor_pg_loss"
    assert key_to_metric_name("trainer", "critic/score/mean") == "relayrl_trainer_critic_score_mean"
