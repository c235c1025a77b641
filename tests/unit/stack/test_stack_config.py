import pytest
from pydantic import ValidationError

from commands.stack.config import StackConfig


def test_sections_become_service_env_vars(tmp_path):
    path = tmp_path / "stack.yaml"
    path.write_text("stack:\n  rollout_replicas: 2\ntrainer:\n  total_steps: 50\n  norm_adv_by_std: false\n")
    config = StackConfig.from_yaml(path)
    assert config.stack.rollout_replicas == 2
    assert config.section_env("trainer") == {
        "RELAYRL_TRAINER_TOTAL_STEPS": "50",
        "RELAYRL_TRAINER_NORM_ADV_BY_STD": "false",
    }


def test_unknown_section_or_stack_key_is_rejected(tmp_path):
    path = tmp_path / "stack.yaml"
    path.write_text("trainr:\n  total_steps: 5\n")
    with pytest.raises(ValidationError, match="trainr"):
        StackConfig.from_yaml(path)
    path.write_text("stack:\n  rollout_replica: 5\n")
    with pytest.raises(ValidationError, match="rollout_replica"):
        StackConfig.from_yaml(path)


def test_a_file_that_is_not_a_mapping_is_rejected(tmp_path):
    path = tmp_path / "stack.yaml"
    path.write_text("- just\n- a list\n")
    with pytest.raises(ValueError, match="expected a mapping"):
        StackConfig.from_yaml(path)
