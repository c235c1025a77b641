"""Every shipped stack config is valid for the services it configures (a typo fails here, not at start)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from commands.stack.config import StackConfig
from services.rollout.config import RolloutSettings
from services.trainer.config import TrainerSettings

CONFIGS = sorted((Path(__file__).resolve().parents[3] / "commands" / "stack" / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_sections_validate(path: Path) -> None:
    config = StackConfig.from_yaml(path)
    TrainerSettings.model_validate(config.trainer)
    RolloutSettings.model_validate(config.rollout)


def test_rollout_correction_without_a_threshold_fails_naming_it() -> None:
    with pytest.raises(ValidationError, match="ROLLOUT_IS_THRESHOLD"):
        TrainerSettings(rollout_is=True)
    with pytest.raises(ValidationError, match="vanilla/decoupled"):
        TrainerSettings(rollout_is=True, rollout_is_threshold=2.0, pg_variant="topr")
