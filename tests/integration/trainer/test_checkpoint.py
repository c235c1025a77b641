"""Checkpoints are atomic: a trainer SIGKILLed in the middle of writing one resumes, exactly,
from the previous one (weights, optimizer, scheduler, RNG and the trainer's own state)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import torch

from services.trainer import checkpoint as ckpt
from services.trainer.model import AdamW, LrSchedule, build_optimizer, retake_hyperparameters
from services.trainer.step import Models

REPO = Path(__file__).resolve().parents[3]

# Saves step 1, trains on, and dies by SIGKILL while writing step 2 (after its shards and the
# rank's RNG file landed, before the rest): the moment a crash would tear a checkpoint.
DIES_MID_SAVE = """
import os, signal, sys, torch
from pathlib import Path
from services.trainer import checkpoint as ckpt
from tests.integration.trainer.test_checkpoint import models, train

root = Path(sys.argv[1])
m = models(seed=0)
train(m)
ckpt.save(root, 1, m, {"step": 1, "version": 1, "released": 8}, keep=2)
torch.save({"actor": m.actor.state_dict(), "opt": m.actor_opt.state_dict(), "rng": torch.get_rng_state(),
            "lr": m.actor_sched.get_last_lr()}, root.parent / "at_step_1.pt")
train(m)
real_save = torch.save
def dying(obj, f, *args, **kwargs):
    real_save(obj, f, *args, **kwargs)
    if "partial" in str(f):
        os.kill(os.getpid(), signal.SIGKILL)
torch.save = dying
ckpt.save(root, 2, m, {"step": 2, "version": 2, "released": 16}, keep=2)
"""


def models(seed: int) -> Models:
    torch.manual_seed(seed)
    actor = torch.nn.Linear(4, 3)
    opt, sched = build_optimizer(actor, AdamW(lr=0.1, weight_decay=0.01), LrSchedule(warmup_steps=3))
    return Models(actor, opt, sched)


def train(m: Models) -> None:
    m.actor(torch.randn(5, 4)).square().sum().backward()
    m.actor_opt.step()
    m.actor_sched.step()
    m.actor_opt.zero_grad()


def test_a_trainer_killed_mid_checkpoint_resumes_exactly_from_the_previous_one(tmp_path):
    root = tmp_path / "checkpoints"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", DIES_MID_SAVE, str(root)], env=env, cwd=REPO, timeout=120)
    assert done.returncode == -signal.SIGKILL, "the writer was meant to die mid-save"
    assert (root / ".partial-step_00000002").is_dir(), "the kill did not land inside the save"
    assert (root / ckpt.LATEST).read_text() == "step_00000001"

    resumed = models(seed=1)  # different initial weights: everything must come from the checkpoint
    state = ckpt.load(root, resumed)
    expected = torch.load(tmp_path / "at_step_1.pt", weights_only=False)
    assert state == {"step": 1, "version": 1, "released": 8}
    for name, tensor in expected["actor"].items():
        assert torch.equal(resumed.actor.state_dict()[name], tensor), name
    exp_state, got_state = expected["opt"]["state"], resumed.actor_opt.state_dict()["state"]
    for key in exp_state:
        for field in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(torch.as_tensor(got_state[key][field]), torch.as_tensor(exp_state[key][field]))
    assert resumed.actor_sched.get_last_lr() == expected["lr"]
    assert torch.equal(torch.get_rng_state(), expected["rng"])

    # The next save clears the torn one and becomes latest.
    train(resumed)
    ckpt.save(root, 2, resumed, {"step": 2, "version": 2, "released": 16}, keep=2)
    assert (root / ckpt.LATEST).read_text() == "step_00000002"
    assert not list(root.glob(".partial-*"))
    assert ckpt.load(root, models(seed=2)) == {"step": 2, "version": 2, "released": 16}


def test_a_run_resumed_with_other_optimizer_settings_trains_with_them(tmp_path):
    """lr, weight_decay, adam_eps and adam_betas are the resumed run's settings, not the checkpoint's (a run
    resumed with a lower lr to calm it gets the lower lr); Adam's moments and the warm-up's place
    are the checkpoint's."""
    root = tmp_path / "checkpoints"
    saved = models(seed=0)
    train(saved)
    ckpt.save(root, 1, saved, {"step": 1, "version": 1, "released": 8}, keep=2)
    torch.manual_seed(1)
    actor = torch.nn.Linear(4, 3)
    adamw = AdamW(lr=0.05, eps=1e-5, betas=(0.9, 0.95))
    opt, sched = build_optimizer(actor, adamw, LrSchedule(warmup_steps=3))
    ckpt.load(root, Models(actor, opt, sched))
    assert retake_hyperparameters(opt, sched, adamw) == [
        "lr 0.1 -> 0.05",
        "weight_decay 0.01 -> 0",
        "adam_eps 1e-08 -> 1e-05",
        "adam_betas (0.9, 0.999) -> (0.9, 0.95)",
    ]
    for got, want in zip(opt.state.values(), saved.actor_opt.state.values(), strict=True):
        assert torch.equal(got["exp_avg"], want["exp_avg"]) and torch.equal(got["exp_avg_sq"], want["exp_avg_sq"])
    group = opt.param_groups[0]
    # The second update of a 3-step warm-up runs at 2/4 of lr, then the third at 3/4.
    assert (group["lr"], group["weight_decay"], group["eps"], group["betas"]) == (0.05 * 2 / 4, 0.0, 1e-5, (0.9, 0.95))
    train(Models(actor, opt, sched))
    assert sched.get_last_lr() == [0.05 * 3 / 4]
