"""``stack.device: cuda``: which GPU each component gets, the engines' memory on a shared one, the
environment each process starts with, and the refusal on a machine without CUDA."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from commands.stack.config import StackConfig
from commands.stack.gpus import device_problem, plan_gpus
from commands.stack.launch import LocalStack
from commands.stack.supervisor import Supervisor

REPO = Path(__file__).resolve().parents[3]
GPU_CONFIG = REPO / "commands" / "stack" / "configs" / "long_add_gpu.yaml"


def test_one_gpu_is_shared_by_the_trainer_and_the_engine_with_half_for_the_engine():
    plan = plan_gpus(("0",), trainer_procs=1, replicas=1, engines_share=0.5, engine_sets_memory=False)
    assert (plan.trainer, plan.engines, plan.engine_mem_fraction) == (("0",), ("0",), (0.5,))
    assert plan.shared and plan.engines_beside_trainer and not plan.serial_start
    assert plan.trainer_env() == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0"}
    assert plan.engine_env(0)["RELAYRL_ENGINE_MEM_FRACTION_STATIC"] == "0.5000"
    assert plan.sharing_line(1) == (
        "stack.device cuda: 1 GPU(s) for 1 trainer rank(s) and 1 engine(s), so they share:"
        " trainer on GPU 0, engine-0 on GPU 0"
    )


def test_engines_sharing_a_gpu_start_one_by_one_each_given_room_for_those_before_it():
    # SGLang's fraction counts what other processes hold: the second engine fills the GPU up to twice
    # one engine's share, the first having taken its own.
    plan = plan_gpus(("0",), trainer_procs=1, replicas=2, engines_share=0.5, engine_sets_memory=False)
    assert plan.engines == ("0", "0") and plan.engine_mem_fraction == (0.25, 0.5)
    assert plan.serial_start


def test_enough_gpus_give_each_component_its_own_trainer_ranks_first():
    plan = plan_gpus(("0", "1", "2", "3"), trainer_procs=2, replicas=2, engines_share=0.5, engine_sets_memory=False)
    assert plan.trainer == ("0", "1") and plan.engines == ("2", "3")
    # Alone on its GPU an engine keeps its own default fraction.
    assert plan.engine_mem_fraction == (None, None)
    assert not plan.shared and not plan.engines_beside_trainer and plan.sharing_line(2) is None
    assert plan.trainer_env()["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert "RELAYRL_ENGINE_MEM_FRACTION_STATIC" not in plan.engine_env(1)


def test_with_fewer_gpus_engines_share_the_ones_left_and_the_trainer_keeps_its_own():
    plan = plan_gpus(("4", "7"), trainer_procs=1, replicas=3, engines_share=0.5, engine_sets_memory=False)
    assert plan.trainer == ("4",) and plan.engines == ("7", "7", "7")
    # No trainer there: the engines share the engine's own default (0.88) in thirds.
    assert plan.engine_mem_fraction == pytest.approx((0.88 / 3, 2 * 0.88 / 3, 0.88))
    assert not plan.engines_beside_trainer
    assert "engine-2 on GPU 7" in plan.sharing_line(1)


def test_an_engine_section_that_sets_its_memory_keeps_it():
    plan = plan_gpus(("0",), trainer_procs=1, replicas=2, engines_share=0.5, engine_sets_memory=True)
    assert plan.engine_mem_fraction == (None, None)


def test_more_trainer_ranks_than_gpus_is_refused_naming_the_setting(monkeypatch):
    # As on a machine with CUDA, whichever this one is: the split is checked after the device.
    monkeypatch.setattr("relayrl.devices.cuda_unavailable_reason", lambda: None)
    config = StackConfig.model_validate({"stack": {"device": "cuda", "gpus": [0], "trainer_procs": 2}})
    assert device_problem(config) == "stack.trainer_procs=2 needs a GPU per rank with stack.device cuda; 1 given (0)"
    assert device_problem(StackConfig.model_validate({"stack": {"device": "cuda", "gpus": [0, 1]}})) is None
    assert device_problem(StackConfig.model_validate({"stack": {"device": "cuda", "gpus": []}})) == (
        "stack.gpus: no GPU to use with stack.device cuda"
    )


def _stack(tmp_path: Path, **sections: dict) -> LocalStack:
    stack = {"device": "cuda", "gpus": [3], "runs_dir": str(tmp_path), "run_id": "r", **sections.pop("stack", {})}
    return LocalStack(StackConfig.model_validate({"stack": stack, **sections}), Supervisor(sink=None))


def test_each_component_starts_on_its_gpu_with_its_device(tmp_path):
    stack = _stack(tmp_path)
    (engine,) = stack._engine_specs(tmp_path / "model")
    trainer = stack._trainer_spec(tmp_path / "model")
    assert engine.env["RELAYRL_ENGINE_DEVICE"] == "cuda" and engine.env["CUDA_VISIBLE_DEVICES"] == "3"
    assert engine.env["RELAYRL_ENGINE_MEM_FRACTION_STATIC"] == "0.5000"
    assert trainer.env["RELAYRL_TRAINER_DEVICE"] == "cuda" and trainer.env["CUDA_VISIBLE_DEVICES"] == "3"
    # A CUDA engine copies each version to the device: it is not served from the replica's memory file.
    assert "RELAYRL_ENGINE_SHARED_WEIGHTS_DIR" not in engine.env
    # Nothing else computes on a GPU.
    assert all("CUDA_VISIBLE_DEVICES" not in spec.env for spec in stack._rollout_specs())
    # The engine shares the trainer's GPU: versions reach it by CUDA IPC handle, unless the section says no.
    assert trainer.env["RELAYRL_TRAINER_SHARE_WEIGHTS_BY_HANDLE"] == "true"
    declined = _stack(tmp_path, trainer={"share_weights_by_handle": False})._trainer_spec(tmp_path / "model")
    assert declined.env["RELAYRL_TRAINER_SHARE_WEIGHTS_BY_HANDLE"].lower() == "false"
    apart = _stack(tmp_path, stack={"gpus": [3, 4]})._trainer_spec(tmp_path / "model")
    assert "RELAYRL_TRAINER_SHARE_WEIGHTS_BY_HANDLE" not in apart.env


def test_a_section_setting_wins_over_the_stacks_default(tmp_path):
    stack = _stack(
        tmp_path,
        stack={"gpu_memory_utilization": 0.3},
        engine={"device": "cpu"},
        trainer={"device": "cpu"},
    )
    (engine,) = stack._engine_specs(tmp_path / "model")
    assert engine.env["RELAYRL_ENGINE_DEVICE"] == "cpu" and "RELAYRL_ENGINE_SHARED_WEIGHTS_DIR" in engine.env
    assert stack._trainer_spec(tmp_path / "model").env["RELAYRL_TRAINER_DEVICE"] == "cpu"
    own = _stack(tmp_path, engine={"mem_fraction_static": 0.7})
    assert own._engine_specs(tmp_path / "model")[0].env["RELAYRL_ENGINE_MEM_FRACTION_STATIC"] == "0.7"
    assert (
        _stack(tmp_path, stack={"gpu_memory_utilization": 0.3})
        ._engine_specs(tmp_path / "model")[0]
        .env["RELAYRL_ENGINE_MEM_FRACTION_STATIC"]
        == "0.3000"
    )


def test_a_cpu_stack_gives_no_gpu_settings(tmp_path):
    config = StackConfig.model_validate({"stack": {"runs_dir": str(tmp_path), "run_id": "r"}})
    stack = LocalStack(config, Supervisor(sink=None))
    (engine,) = stack._engine_specs(tmp_path / "model")
    assert stack.gpus is None and stack.gpu_line() is None
    assert not {"RELAYRL_ENGINE_DEVICE", "CUDA_VISIBLE_DEVICES"} & set(engine.env)
    assert "RELAYRL_TRAINER_DEVICE" not in stack._trainer_spec(tmp_path / "model").env


def test_the_gpu_example_parses_anywhere_and_is_the_cpu_recipe_on_cuda():
    gpu = StackConfig.from_yaml(GPU_CONFIG)
    cpu = StackConfig.from_yaml(GPU_CONFIG.with_name("long_add.yaml"))
    assert gpu.stack.device == "cuda" and gpu.stack.model_preset == "small"
    # Only where it computes, and the longer start that an engine on CUDA takes.
    on_gpu = {"device", "ready_timeout_s"}
    assert gpu.stack.model_dump(exclude=on_gpu) == cpu.stack.model_dump(exclude=on_gpu)
    checkpoints = {"save_freq", "checkpoint_every"}
    assert {k: v for k, v in gpu.trainer.items() if k not in checkpoints} == {
        k: v for k, v in cpu.trainer.items() if k not in checkpoints
    }
    assert (gpu.rollout, gpu.engine) == (cpu.rollout, cpu.engine)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: nothing to refuse")
def test_up_with_device_cuda_without_cuda_stops_on_one_line_naming_the_setting(tmp_path):
    runs = tmp_path / "runs"
    path = tmp_path / "stack.yaml"
    path.write_text(GPU_CONFIG.read_text().replace("stack:\n", f"stack:\n  runs_dir: {runs}\n", 1))
    done = subprocess.run(
        [sys.executable, "-m", "commands.cli", "up", "--config", str(path)],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"{path}: invalid config",
        f"  stack.device: cuda requested but {_reason()}",
    ]
    assert not runs.exists(), "a run directory means the stack started"


def _reason() -> str:
    from relayrl.devices import cuda_unavailable_reason

    reason = cuda_unavailable_reason()
    assert reason is not None
    return reason


def test_only_replicas_whose_engine_is_on_rank_0s_gpu_load_versions_by_handle(tmp_path):
    # Two ranks on two GPUs and two engines beside them: only GPU 3 (rank 0's) holds the shared copies.
    stack = _stack(tmp_path, stack={"gpus": [3, 4], "trainer_procs": 2, "rollout_replicas": 2})
    assert stack.gpus is not None and stack.gpus.engines == ("3", "4")
    stack._engine_specs(tmp_path / "model")
    first, second = stack._rollout_specs()
    assert "RELAYRL_ROLLOUT_LOAD_WEIGHTS_BY_HANDLE" not in first.env
    assert second.env["RELAYRL_ROLLOUT_LOAD_WEIGHTS_BY_HANDLE"] == "false"
    assert stack._trainer_spec(tmp_path / "model").env["RELAYRL_TRAINER_SHARE_WEIGHTS_BY_HANDLE"] == "true"
