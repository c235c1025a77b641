"""`relayrl model init-tiny` writes a directory that stock transformers loads."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from relayrl.cli import app


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_init_tiny_loads_with_auto_classes(tmp_path, arch):
    result = CliRunner().invoke(app, ["model", "init-tiny", str(tmp_path), "--arch", arch, "--seed", "3"])
    assert result.exit_code == 0, result.output
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert model.config.model_type == arch
    assert 100_000 < sum(p.numel() for p in model.parameters()) < 1_000_000
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "reverse 0123 Ü"}], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert max(ids) < model.config.vocab_size
    assert tokenizer.eos_token_id == model.config.eos_token_id
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), model.config.vocab_size)


def test_same_seed_gives_the_same_weights(tmp_path):
    runner = CliRunner()
    for name in ("a", "b"):
        assert runner.invoke(app, ["model", "init-tiny", str(tmp_path / name), "--seed", "5"]).exit_code == 0
    assert (tmp_path / "a/model.safetensors").read_bytes() == (tmp_path / "b/model.safetensors").read_bytes()


def test_unknown_architecture_is_rejected(tmp_path):
    result = CliRunner().invoke(app, ["model", "init-tiny", str(tmp_path), "--arch", "gpt9"])
    assert result.exit_code != 0
    assert "unknown architecture" in result.output


def test_loader_explains_a_missing_model(tmp_path):
    from relayrl.models.loading import load_causal_lm

    with pytest.raises(FileNotFoundError, match="init-tiny"):
        load_causal_lm(tmp_path)
