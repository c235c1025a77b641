"""`relayrl model init-tiny` writes a directory that stock transformers loads."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from commands.cli import app


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


# Qwen2.5-0.5B's published parameter count (tied embeddings counted once).
QWEN25_05B_PARAMS = 494_032_768


@pytest.mark.parametrize(
    ("preset", "low", "high"), [("tiny", 200_000, 300_000), ("small", 10_000_000, 30_000_000), ("base", 0, 0)]
)
def test_preset_parameter_counts(preset, low, high):
    from relayrl.models.tiny import count_parameters, hf_config, preset_spec

    config = hf_config(preset_spec(preset))
    params = count_parameters(config)
    if preset == "base":
        assert params == QWEN25_05B_PARAMS
        assert (config.hidden_size, config.num_hidden_layers, config.intermediate_size) == (896, 24, 4864)
        assert (config.num_attention_heads, config.num_key_value_heads, config.vocab_size) == (14, 2, 151936)
        assert config.max_position_embeddings == 32768
        assert config.rope_parameters["rope_theta"] == 1_000_000.0
        assert config.rms_norm_eps == 1e-6
        assert config.tie_word_embeddings
    else:
        assert low <= params <= high
        assert config.max_position_embeddings >= 2048


def test_small_preset_loads_with_auto_classes_and_info_reports_it(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["model", "init-tiny", str(tmp_path), "--preset", "small", "--dtype", "bfloat16"])
    assert result.exit_code == 0, result.output
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    params = sum(p.numel() for p in model.parameters())
    assert 10_000_000 <= params <= 30_000_000
    assert model.dtype == torch.bfloat16
    # bf16 on disk: about two bytes per parameter.
    assert (tmp_path / "model.safetensors").stat().st_size < 2.1 * params
    ids = AutoTokenizer.from_pretrained(tmp_path)("hello")["input_ids"]
    with torch.no_grad():
        assert model(torch.tensor([ids])).logits.shape == (1, len(ids), model.config.vocab_size)
    info = runner.invoke(app, ["model", "info", str(tmp_path)])
    assert info.exit_code == 0, info.output
    assert f"{params:,} parameters" in info.output
    assert f"float32 {params * 4:,}" in info.output
    assert f"bfloat16 {params * 2:,}" in info.output
    assert '"hidden_size": 384' in info.output


def test_tiny_preset_keeps_todays_weights_with_a_longer_context(tmp_path):
    from relayrl.models.tiny import TinyModelSpec, init_tiny

    runner = CliRunner()
    assert runner.invoke(app, ["model", "init-tiny", str(tmp_path / "preset"), "--preset", "tiny"]).exit_code == 0
    # Today's spec apart from the context: RoPE has no parameters, so the weights are identical.
    init_tiny(tmp_path / "old", TinyModelSpec(max_positions=512))
    assert (tmp_path / "preset/model.safetensors").read_bytes() == (tmp_path / "old/model.safetensors").read_bytes()
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "preset").config.max_position_embeddings >= 2048


def test_unknown_preset_is_rejected_naming_the_choices(tmp_path):
    result = CliRunner().invoke(app, ["model", "init-tiny", str(tmp_path), "--preset", "huge"])
    assert result.exit_code != 0
    # The message may wrap inside rich's error box.
    message = " ".join(result.output.replace("│", " ").split())
    assert "unknown model preset 'huge'; choose one of tiny, tiny-rm, small, base" in message
    assert not (tmp_path / "config.json").exists()


def test_stack_settings_reject_an_unknown_preset():
    from pydantic import ValidationError

    from commands.stack.config import StackSettings

    assert StackSettings().model_preset == "tiny"
    with pytest.raises(ValidationError, match="model_preset"):
        StackSettings(model_preset="huge")


def test_the_local_stack_builds_its_model_of_the_configured_preset(tmp_path):
    from commands.stack.config import StackConfig, StackSettings
    from commands.stack.launch import LocalStack, prepare_model
    from relayrl.models.tiny import count_parameters

    settings = StackSettings(run_id="r", runs_dir=tmp_path, model_preset="small", tiny_arch="llama")
    model_dir = prepare_model(LocalStack(StackConfig(stack=settings), supervisor=None))
    config = AutoConfig.from_pretrained(model_dir)
    assert config.model_type == "llama"
    assert 10_000_000 <= count_parameters(config) <= 30_000_000
