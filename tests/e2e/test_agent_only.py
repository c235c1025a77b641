"""Agent-only training as a user runs it: ``relayrl up`` with ``rollout.source: agents`` (the
example config), the example agent pushing groups through the real ``openai`` client, and
``relayrl ctl group`` telling which were trained. The trainer trains N steps from exactly N of the
groups the agent pushed (the rollout generates nothing of its own), and a group pushed after it
finished (``--keep-alive``) is reported as never trained."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "agent_only"
STEPS = 3


def _env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def _agent(base_url: str, token: str, groups: int, env: dict[str, str]) -> list[dict]:
    argv = ["--base-url", base_url, "--api-key", token, "--groups", str(groups)]
    done = subprocess.run(
        [sys.executable, str(EXAMPLE / "agent.py"), *argv], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def _ctl_group(env_file: Path, group_id: str, env: dict[str, str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "commands.cli", "ctl", "--env-file", str(env_file), "group", group_id, "--json"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    return json.loads(done.stdout)


# Past the suite's 300 s: the stop below may take its whole bound on a loaded machine.
@pytest.mark.timeout(480)
def test_the_trainer_trains_n_steps_from_the_n_groups_an_openai_agent_pushed(tmp_path, tiny_model_dir):
    config = yaml.safe_load((EXAMPLE / "stack.yaml").read_text())
    runs = tmp_path / "runs"
    config["stack"].update(runs_dir=str(runs), model_dir=str(tiny_model_dir), ready_timeout_s=120)
    assert config["trainer"]["total_steps"] == STEPS and config["trainer"]["batch_size"] == 1
    path = tmp_path / "stack.yaml"
    path.write_text(yaml.safe_dump(config))
    # PYTHONFAULTHANDLER: a SIGABRT makes `up` print every thread's stack (see the stop below).
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONFAULTHANDLER": "1"}
    run_dir = runs / "agent-only"
    up = subprocess.Popen(
        [sys.executable, "-m", "commands.cli", "up", "--config", str(path), "--keep-alive"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=env,
    )  # fmt: skip
    try:
        env_file = run_dir / "ctl.env"
        wait_until(lambda: env_file.is_file() or up.poll() is not None, 240, "the stack to be up", poll_s=0.5)
        assert up.poll() is None, up.communicate()[0]
        ctl = _env_file(env_file)
        rollout, token = ctl["RELAYRL_CTL_ROLLOUT_URLS"].split(",")[0], ctl["RELAYRL_API_TOKEN"]

        first = _agent(rollout, token, STEPS - 1, env)
        assert [g["status"] for g in first] == ["queued"] * (STEPS - 1), first
        for group in first:
            fate = wait_until(
                lambda g=group: (r := _ctl_group(env_file, g["group_id"], env))["status"] == "trained" and r,
                120,
                f"group {group['group_id']} trained",
                poll_s=1.0,
            )
            assert fate["detail"]["trajectory_id"] == group["trajectory_id"]
        last = _agent(rollout, token, 1, env)
        # --keep-alive: the services stay up after the last step. A group pushed then is queued and
        # never trained, and stopping the stack says so.
        wait_until(lambda: (run_dir / "report.json").is_file() or up.poll() is not None, 240, "the run to finish")
        (extra,) = _agent(rollout, token, 1, env)
        up.send_signal(signal.SIGINT)
        # The stack stops wave by wave, each component given 15 s after SIGTERM and 10 s more to be
        # gone: about 100 s at worst for this stack's four waves. A stop past 200 s is a hang, and
        # its stacks are what the next reader needs.
        try:
            output, _ = up.communicate(timeout=200)
        except subprocess.TimeoutExpired:
            up.send_signal(signal.SIGABRT)
            output, _ = up.communicate(timeout=30)
            raise AssertionError(f"relayrl up did not stop within 200 s of SIGINT:\n{output[-8000:]}") from None
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 0, output
    lines = [json.loads(line) for line in (run_dir / "groups.jsonl").read_text().splitlines()]
    trained = [gid for line in lines if "step" in line for gid in line["group_ids"]]
    assert sorted(trained) == sorted(g["trajectory_id"] for g in [*first, *last]), "only the agent's groups"
    assert extra["status"] == "queued" and extra["trajectory_id"] not in trained
    assert "Groups pushed from now on (agents through the OpenAI endpoint) are queued and never trained" in output
    assert "1 trajectory group(s) left in the queue were not trained" in output, output
    assert json.loads((run_dir / "report.json").read_text())["steps"] == STEPS
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["trainer/processed_samples"] == STEPS * 2
