"""The CPU split of the local stack: engines and trainer on their own cores, threads to match."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from commands.stack.config import StackConfig
from commands.stack.cpus import CpuSets, plan_cpus


def test_auto_on_two_cores_gives_one_to_the_engine_and_one_to_the_trainer():
    plan = plan_cpus("auto", replicas=1, trainer_procs=1, available=(0, 1))
    assert (plan.engine_cpus, plan.engine_threads, plan.trainer_cpus, plan.trainer_threads) == ((0,), 1, (1,), 1)
    # The light services keep off the trainer's core.
    assert plan.service_cpus == (0,) and plan.describe()["services"] == [0]


def test_auto_shares_each_half_among_its_processes():
    plan = plan_cpus("auto", replicas=2, trainer_procs=2, available=tuple(range(8)))
    assert plan.engine_cpus == (0, 1, 2, 3) and plan.engine_threads == 2
    assert plan.trainer_cpus == (4, 5, 6, 7) and plan.trainer_threads == 2


def test_one_core_or_off_pins_nothing():
    for plan in (plan_cpus("auto", 1, 1, available=(3,)), plan_cpus("off", 1, 1, available=(0, 1))):
        assert plan.engine_cpus is None and plan.trainer_cpus is None and plan.service_cpus is None
        assert plan.engine_threads == plan.trainer_threads == 1


def test_explicit_sets_are_used_and_cpus_outside_the_allowed_ones_are_refused():
    plan = plan_cpus(CpuSets(engines=[1], trainer=[0, 2]), replicas=1, trainer_procs=1, available=(0, 1, 2))
    assert plan.engine_cpus == (1,) and plan.trainer_cpus == (0, 2) and plan.trainer_threads == 2
    with pytest.raises(ValueError, match=r"CPUs \[7\]"):
        plan_cpus(CpuSets(engines=[7], trainer=[0]), 1, 1, available=(0, 1))


def test_the_yaml_spelling_of_each_form_parses():
    assert StackConfig.model_validate({"stack": {"cpus": "off"}}).stack.cpus == "off"
    sets = StackConfig.model_validate({"stack": {"cpus": {"engines": [0], "trainer": [1]}}}).stack.cpus
    assert sets == CpuSets(engines=[0], trainer=[1])
    with pytest.raises(ValidationError, match="cpus"):
        StackConfig.model_validate({"stack": {"cpus": "half"}})
