"""``relayrl sft`` end to end: 2 gloo ranks under torchrun against one in-process rank."""

import json
import random
import sys

import pytest
import torch

from relayrl.models.loading import load_causal_lm, load_tokenizer
from services.trainer.model import load_actor
from tests.integration.trainer.harness import run_logged

STEPS = 8


def write_data(path) -> None:
    """Copy-the-digits demonstrations, single-turn and a few multi-turn chats."""
    rng = random.Random(0)
    rows = []
    for i in range(20):
        digits = "".join(rng.choice("0123") for _ in range(4))
        if i % 5:
            rows.append({"prompt": f"copy {digits}", "response": digits})
        else:
            chat = [
                {"role": "user", "content": f"copy {digits}"},
                {"role": "assistant", "content": digits},
                {"role": "user", "content": f"again {digits[::-1]}"},
                {"role": "assistant", "content": digits[::-1]},
            ]
            rows.append({"messages": chat})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def run_sft(model_dir, data, out, nproc: int, steps: int, device: str = "cpu", timeout_s: float = 120) -> list[dict]:
    cmd = [
        sys.executable, "-m", "commands.cli", "sft", "--device", device,
        "--model", str(model_dir), "--data", str(data), "--out", str(out), "--nproc", str(nproc),
        "--train-batch-size", "8", "--micro-batch-size-per-gpu", "2", "--lr", "3e-3",
        "--total-training-steps", str(steps), "--seed", "3",
    ]  # fmt: skip
    output = run_logged(cmd, out.parent / f"{out.name}.log", timeout_s)
    summaries = [json.loads(line) for line in output.splitlines() if line.startswith('{"steps"')]
    assert len(summaries) == 1, output[-3000:]  # printed by rank 0 only
    summary = summaries[0]
    assert summary["steps"] == steps and summary["out_dir"] == str(out)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sft")
    data = tmp / "train.jsonl"
    write_data(data)
    two = run_sft(tiny_model_dir, data, tmp / "two", nproc=2, steps=STEPS)
    one = run_sft(tiny_model_dir, data, tmp / "one", nproc=1, steps=STEPS)
    return tmp, two, one


def test_two_ranks_lower_the_loss_and_log_every_step(runs):
    _, two, _ = runs
    assert [m["step"] for m in two] == list(range(1, STEPS + 1))
    losses = [m["train/loss"] for m in two]
    # From about log(259) ≈ 5.6 (a random model); the data is short and regular.
    assert max(losses[-2:]) < 0.7 * losses[0], losses
    assert all(m["perf/tokens_per_s"] > 0 and m["train/trained_tokens"] > 0 for m in two)


def test_the_written_directory_loads_and_holds_trained_weights(runs, tiny_model_dir):
    tmp, _, _ = runs
    tuned = load_causal_lm(tmp / "two").state_dict()
    base = load_causal_lm(tiny_model_dir).state_dict()
    assert tuned.keys() == base.keys()
    changed = [name for name in base if not torch.equal(base[name], tuned[name])]
    assert len(changed) == len(base), set(base) - set(changed)
    # The trainer starts RL from it as from any model directory.
    actor = load_actor(tmp / "two", torch.device("cpu"))
    torch.testing.assert_close(actor.state_dict()["model.norm.weight"], tuned["model.norm.weight"])
    tokenizer = load_tokenizer(tmp / "two")
    assert tokenizer.eos_token == load_tokenizer(tiny_model_dir).eos_token
    assert (tmp / "two" / "generation_config.json").is_file()


def test_one_rank_takes_the_same_steps_as_two(runs):
    tmp, two, one = runs
    # Same fp32 arithmetic on the same batches: only the order of the sums (two partial sums
    # all-reduced vs one) and the padded shapes of the micro-batches differ, which moves a
    # loss of about 5 by ~1e-7 (measured); a wrong normaliser, say each rank's own mean, or a
    # lost shard moves it by more than 1e-2.
    assert one[0]["train/loss"] == pytest.approx(two[0]["train/loss"], rel=1e-5)
    for a, b in zip(one, two, strict=True):
        assert a["train/trained_tokens"] == b["train/trained_tokens"]
        assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-5), a["step"]
        assert a["train/grad_norm"] == pytest.approx(b["train/grad_norm"], rel=1e-4), a["step"]
    tuned_one = load_causal_lm(tmp / "one").state_dict()
    for name, w in load_causal_lm(tmp / "two").state_dict().items():
        torch.testing.assert_close(tuned_one[name], w, rtol=1e-4, atol=1e-5, msg=name)
