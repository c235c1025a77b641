"""One short trainer run with every experiment tracker on and ``save_hf_model``: TensorBoard and
wandb (offline) receive exactly the metrics of ``metrics.jsonl``, and each checkpoint's ``hf/`` is
what ``relayrl export`` writes for that step."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from relayrl.redis_process import RedisProcess
from tests.integration.trainer.harness import Stack, start_trainer, stop_group

STEPS = 2
SETTINGS = dict(
    total_steps=STEPS,
    save_freq=STEPS,
    batch_size=2,
    n_samples=2,
    max_new_tokens=4,
    micro_batch_tokens=64,
    dataset_size=16,
    lr=1e-2,  # large enough that the checkpointed weights differ from the base model
    logger='["console", "tensorboard", "wandb"]',
    save_hf_model="true",
)


@dataclass
class Run:
    run_dir: Path
    base_dir: Path
    wandb_dir: Path
    rows: list[dict[str, float]]


@pytest.fixture(scope="module")
def run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    tmp = tmp_path_factory.mktemp("trackers")
    run_dir, wandb_dir = tmp / "run", tmp / "wandb"
    redis = RedisProcess(data_dir=tmp / "redis").start()
    try:
        with Stack(redis.url, f"t{uuid.uuid4().hex[:6]}") as stack:
            env = stack.trainer_env(tiny_model_dir, run_dir, **SETTINGS)
            env.pop("WANDB_API_KEY", None)
            env.update(WANDB_MODE="offline", WANDB_DIR=str(wandb_dir), WANDB_SILENT="true")
            proc = start_trainer(env, tmp / "trainer.log")
            try:
                assert proc.wait(120) == 0, (tmp / "trainer.log").read_text()[-3000:]
            finally:
                stop_group(proc)
    finally:
        redis.stop()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == list(range(1, STEPS + 1))
    # What `relayrl up` writes in a run directory: `relayrl export` finds the base model in it.
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"stack": {"model_dir": str(tiny_model_dir)}}))
    return Run(run_dir, tiny_model_dir, wandb_dir, rows)


def _metrics(row: dict[str, float]) -> dict[str, float]:
    return {key: value for key, value in row.items() if key not in ("step", "time")}


def test_tensorboard_has_every_metric_at_its_step(run: Run) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run.run_dir / "tensorboard"), size_guidance={"scalars": 0}).Reload()
    assert set(events.Tags()["scalars"]) == {key for row in run.rows for key in _metrics(row)}
    for row in run.rows:
        for key, value in _metrics(row).items():
            logged = {event.step: event.value for event in events.Scalars(key)}
            assert logged[row["step"]] == pytest.approx(value, rel=1e-6, abs=1e-6), (key, row["step"])
    assert "actor/pg_loss" in events.Tags()["scalars"]


def _wandb_records(path: Path) -> list[bytes]:
    """The records of a ``.wandb`` file: leveldb's log format (32 KiB blocks of checksummed chunks)
    behind a 7-byte header, as ``wandb sync`` reads it."""
    block, data, records, pending = 32768, path.read_bytes(), [], b""
    at = 7
    while at + 7 <= len(data):
        if block - at % block < 7:  # a block's tail too short for a chunk header is padding
            at += block - at % block
            continue
        length, kind = int.from_bytes(data[at + 4 : at + 6], "little"), data[at + 6]
        chunk, at = data[at + 7 : at + 7 + length], at + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk  # full/first start, middle/last continue
        if kind in (1, 4):
            records.append(pending)
    return records


def test_wandb_offline_run_has_every_metric_at_its_step(run: Run) -> None:
    from wandb.proto.wandb_internal_pb2 import Record

    (run_file,) = run.wandb_dir.glob("wandb/offline-run-*/run-*.wandb")
    history: dict[int, dict[str, float]] = {}
    for raw in _wandb_records(run_file):
        record = Record.FromString(raw)
        if record.WhichOneof("record_type") == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            history[record.history.step.num] = items
    for row in run.rows:
        logged = history[row["step"]]
        for key, value in _metrics(row).items():
            assert logged[key] == pytest.approx(value), (key, row["step"])
    assert "actor/pg_loss" in history[STEPS]


def test_checkpoint_hf_dir_holds_the_exported_policy(run: Run, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from commands.stack.export import export_policy

    checkpoint = export_policy(run.run_dir, tmp_path / "exported", step=STEPS)
    assert checkpoint.name == f"step_{STEPS:08d}"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        assert (checkpoint / "hf" / name).is_file(), name
    from_checkpoint = AutoModelForCausalLM.from_pretrained(checkpoint / "hf").state_dict()
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "exported").state_dict()
    base = AutoModelForCausalLM.from_pretrained(run.base_dir).state_dict()
    assert from_checkpoint.keys() == exported.keys()
    for name, tensor in exported.items():
        assert torch.equal(from_checkpoint[name], tensor), name
    assert any(not torch.equal(tensor, base[name]) for name, tensor in exported.items()), "no training happened"
