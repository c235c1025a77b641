"""``relayrl up`` as a user runs it: verl's reward file and dataset paths relative to the
config, a quiet console, a run stopped with Ctrl-C and resumed where it left off, and a report,
a plot and an export at the end: one journey, since every start of the stack costs CI its start-up."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from commands.stack.progress import REWARD_KEY
from relayrl import http_client
from relayrl.forkserver import ENV_VARIABLE as FORKSERVER_VARIABLE
from relayrl.net import free_port
from tests.integration.rollout.conftest import EngineProcess
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
# Scores in [0.25, 0.75], which no built-in scorer gives: the metrics show this file was called.
REWARD = (
    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
    "    return 0.25 + 0.5 * solution_str.strip().startswith(ground_truth)\n"
)


def _rows(count: int) -> str:
    rows = []
    for index in range(count):
        bit = "01"[index % 2]
        rows.append(
            {
                "data_source": "flip_bit",
                "prompt": [{"role": "user", "content": f"flip {bit}"}],
                "reward_model": {"ground_truth": "1" if bit == "0" else "0"},
            }
        )
    return "".join(json.dumps(row) + "\n" for row in rows)


# The suite's 300 s per test, plus room: the journey runs the stack twice (on a loaded machine it took 294 s).
@pytest.mark.timeout(420)
def test_up_trains_on_a_users_files_quietly_resumes_where_it_was_stopped_reports_and_exports(tmp_path, tiny_model_dir):
    project = tmp_path / "project"
    project.mkdir()
    (project / "my_reward.py").write_text(REWARD)
    (project / "train.jsonl").write_text(_rows(64))
    runs = tmp_path / "runs"
    (project / "stack.yaml").write_text(
        f"stack: {{run_id: mine, runs_dir: {runs}, ready_timeout_s: 120}}\n"
        "custom_reward_function: {path: my_reward.py, name: compute_score}\n"
        "trainer: {dataset: train.jsonl, n_samples: 4, batch_size: 4, max_new_tokens: 3, total_steps: 8,"
        " save_freq: 2, lr: 0.003}\n"
        "rollout: {max_inflight_prompts: 8, max_new_tokens: 3}\n"
    )
    # Without the suite's fork server: `up` starts its own, as for a user, and forks its components from it.
    env = {**{k: v for k, v in os.environ.items() if k != FORKSERVER_VARIABLE}, "PYTHONPATH": str(REPO)}
    run_dir = runs / "mine"
    # The model from the command line (as after `relayrl sft`), not from the config.
    argv = ["up", "--config", "project/stack.yaml", "--model-dir", str(tiny_model_dir)]
    first = subprocess.Popen(
        [sys.executable, "-m", "commands.cli", *argv],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=env,
    )  # fmt: skip

    def checkpointed() -> bool:
        if (run_dir / "checkpoints" / "latest").is_file():
            return True
        assert first.poll() is None, "no checkpoint before the run ended"
        return False

    wait_until(checkpointed, 200, "the first checkpoint", poll_s=0.2)
    first.send_signal(signal.SIGINT)
    stopped_output, _ = first.communicate(timeout=60)
    assert first.returncode == 130, stopped_output
    assert "Traceback" not in stopped_output, stopped_output
    checkpoint_step = json.loads(
        (
            run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text().strip() / "trainer_state.json"
        ).read_text()
    )["step"]
    assert checkpoint_step < 8
    # The stop names what the run can resume from.
    assert f"checkpoint at step {checkpoint_step}:" in stopped_output, stopped_output
    assert "relayrl up --resume mine" in stopped_output

    resumed = subprocess.run(
        [sys.executable, "-m", "commands.cli", "up", "--resume", str(run_dir)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=280,
    )  # fmt: skip
    output = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, output
    rows = _rows_of(run_dir)
    steps = [row["trainer/global_steps"] for row in rows if "trainer/global_steps" in row]
    assert steps[-1] == 8
    session = steps[steps.index(checkpoint_step + 1, len(steps) - (8 - checkpoint_step)) :]
    assert session == list(range(checkpoint_step + 1, 9)), steps
    rates = [float(part.split()[0]) for part in output.split(" | ") if part.endswith("samples/s")]
    assert rates and max(rates) < 10_000, f"samples/s after resuming: {rates}"
    assert f"resuming from step {checkpoint_step} (checkpoint " in output, output
    report = json.loads((run_dir / "report.json").read_text())
    assert report["steps"] == 8 and report["resumed_from_step"] == checkpoint_step
    assert report["span_steps"] == 8 - checkpoint_step and report["wall_s"] > 0
    assert f"over {8 - checkpoint_step} steps ({checkpoint_step + 1}-8, resumed from step {checkpoint_step})" in output
    assert (run_dir / "reward.png").stat().st_size > 0
    # The user's reward file scored every step, before the stop and after the resume.
    scores = [row[REWARD_KEY] for row in rows if REWARD_KEY in row]
    assert scores and all(0.25 <= score <= 0.75 for score in scores), scores
    assert "report.json" in output and "reward " in output

    # Service logs go to runs/<id>/logs/, not the console; printed commands are never wrapped.
    assert " INFO " not in output, output
    assert (run_dir / "logs" / "trainer.log").stat().st_size > 0
    ctl_lines = [line for line in output.splitlines() if "relayrl ctl --env-file" in line]
    assert ctl_lines and ctl_lines[0].rstrip().endswith("status --all"), output

    # Resuming the finished run says so and changes nothing.
    before = (run_dir / "report.json").read_bytes()
    again = subprocess.run(
        [sys.executable, "-m", "commands.cli", "up", "--resume", str(run_dir)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60,
    )  # fmt: skip
    assert again.returncode == 0 and "already finished (8 of 8 steps); nothing to resume" in again.stdout, again.stderr
    assert (run_dir / "report.json").read_bytes() == before

    _exported_policy_generates_what_the_engine_did(tmp_path, run_dir, tiny_model_dir, step=8)


def _exported_policy_generates_what_the_engine_did(tmp_path: Path, run_dir: Path, base_dir: Path, step: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "exported"
    done = subprocess.run(
        [sys.executable, "-m", "commands.cli", "export", str(run_dir), str(out), "--step", str(step)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        assert (out / name).is_file(), name
    # Versions lived in shared memory while the run served them and are gone with it; the export
    # of a step is the version published at that step (a checkpoint holds a published version's
    # weights exactly: tests/integration/trainer), so the engine loads it as that version and must
    # generate what transformers generates from it.
    assert not list((run_dir / "weights").rglob("*.safetensors")), "no weights file per version on disk"
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    prompts = [
        tokenizer(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": f"flip {bit}"}], tokenize=False, add_generation_prompt=True
            ),
            add_special_tokens=False,
        )["input_ids"]
        for bit in "01"
    ]
    engine = EngineProcess(base_dir, free_port("127.0.0.1")).start()
    try:
        loaded = http_client.post(
            f"{engine.url}/update_weights_from_disk",
            json={"model_path": str(out), "weight_version": str(step)},
            timeout=60,
        )
        assert loaded.status_code == 200 and loaded.json()["success"], loaded.text
        for prompt in prompts:
            served = http_client.post(
                f"{engine.url}/generate",
                json={"input_ids": prompt, "sampling_params": {"max_new_tokens": 3, "temperature": 0}},
                timeout=60,
            ).json()
            generated = model.generate(
                torch.tensor([prompt]), max_new_tokens=3, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )[0, len(prompt) :].tolist()
            assert generated[: len(served["output_ids"])] == served["output_ids"], (generated, served)
    finally:
        engine.stop()


def _rows_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
