"""The engine and the rollout service of a pod share one memory volume at the directory the
rollout setting names, so a version received there is loaded by the engine without a disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.deploy.chart import CHART, FULLNAME, container, render


@pytest.mark.parametrize("profile", [None, CHART / "ci" / "cpu-values.yaml"], ids=["sglang", "builtin"])
def test_engine_and_rollout_mount_one_memory_volume_at_the_shm_dir(profile: Path | None) -> None:
    chart = render(*([profile] if profile else []), sets=("rollout.weightsShmVolume.sizeLimit=3Gi",))
    spec = chart.pod_spec("Deployment", "rollout")
    settings = chart.get("ConfigMap", f"{FULLNAME}-rollout-settings")["data"]
    shm_dir = settings["RELAYRL_ROLLOUT_WEIGHTS_SHM_DIR"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "weights-shm"]
    assert volume["emptyDir"] == {"medium": "Memory", "sizeLimit": "3Gi"}
    for name in ("engine", "rollout"):
        mounts = {m["name"]: m["mountPath"] for m in container(spec, name)["volumeMounts"]}
        assert mounts["weights-shm"] == shm_dir, name


def test_the_builtin_engine_serves_versions_from_that_memory_in_place() -> None:
    chart = render(CHART / "ci" / "cpu-values.yaml")
    rollout = chart.get("ConfigMap", f"{FULLNAME}-rollout-settings")["data"]
    engine = chart.get("ConfigMap", f"{FULLNAME}-engine-settings")["data"]
    assert engine["RELAYRL_ENGINE_SHARED_WEIGHTS_DIR"] == rollout["RELAYRL_ROLLOUT_WEIGHTS_SHM_DIR"]
