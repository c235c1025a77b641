"""LoRA in the trainer, in one process: what trains, what a version publishes, and the reference
policy that is the actor with its adapter off."""

from __future__ import annotations

import torch
from peft import get_peft_model_state_dict

from relayrl.models.tiny import init_tiny, preset_spec
from services.paramsync.tensors import as_pairs, build_manifest
from services.trainer import distributed as D
from services.trainer import lora
from services.trainer.batching import TrainSample, collate
from services.trainer.config import TrainerSettings
from services.trainer.gather import published_items
from services.trainer.model import load_actor, policy_forward
from services.trainer.step import train_step
from services.trainer.trainer import build_models, gather_weights


def _samples() -> list[TrainSample]:
    rewards = [1.0, 0.0, 1.0, 0.0]
    return [
        TrainSample(i // 2, [5, 6, 7], [10 + i, 11, 12], [-1.0] * 3, [0, 0, r], r, 0) for i, r in enumerate(rewards)
    ]


def _settings(model_dir, **kw) -> TrainerSettings:
    return TrainerSettings(model_dir=model_dir, lr=1e-2, lora_rank=4, lora_alpha=8, **kw)


def _ctx() -> D.DistContext:
    return D.DistContext(rank=0, world_size=1, device=torch.device("cpu"))


def test_settings_take_verl_spellings_of_target_modules():
    assert TrainerSettings().target_modules == "all-linear"
    assert TrainerSettings(target_modules="q_proj, v_proj").target_modules == ["q_proj", "v_proj"]
    assert TrainerSettings(target_modules='["q_proj","o_proj"]').target_modules == ["q_proj", "o_proj"]
    assert not TrainerSettings().lora and TrainerSettings(lora_rank=8).lora


def test_only_the_adapter_trains_and_a_version_is_the_adapter_in_peft_names(tiny_model_dir):
    torch.manual_seed(0)
    models = build_models(_settings(tiny_model_dir), _ctx(), fsdp=False)
    actor = models.actor
    trained = {id(p) for group in models.actor_opt.param_groups for p in group["params"]}
    trainable = {id(p) for n, p in actor.named_parameters() if "lora_" in n}
    assert trained == trainable and trainable
    base_before = {n: p.detach().clone() for n, p in actor.named_parameters() if "lora_" not in n}

    metrics = train_step(models, _samples(), _settings(tiny_model_dir), pad_id=0)
    assert metrics["actor/grad_norm"] > 0

    for name, param in actor.named_parameters():
        if name in base_before:
            assert torch.equal(param, base_before[name]), name
    published = dict(gather_weights(actor, published_items(actor)))
    expected = get_peft_model_state_dict(actor)
    assert published.keys() == expected.keys()
    for name, tensor in published.items():
        assert torch.equal(tensor, expected[name]), name
    # the step moved the adapter: B starts at zero in peft
    assert any(t.abs().sum() > 0 for n, t in published.items() if "lora_B" in n)


def test_reference_with_the_adapter_off_is_the_base_model(tiny_model_dir):
    torch.manual_seed(0)
    settings = _settings(tiny_model_dir, use_kl_loss=True)
    models = build_models(settings, _ctx(), fsdp=False)
    for _ in range(2):
        train_step(models, _samples(), settings, pad_id=0)
    mb = collate(_samples(), [0, 1, 2, 3], pad_id=0)
    base = load_actor(tiny_model_dir, torch.device("cpu"))
    with torch.no_grad():
        ref = policy_forward(models.ref, mb, 1.0, False).logp_BT
        expected = policy_forward(base, mb, 1.0, False).logp_BT
        actor = policy_forward(models.actor, mb, 1.0, False).logp_BT
    torch.testing.assert_close(ref, expected, atol=1e-6, rtol=0)
    assert (actor - expected).abs().max() > 1e-4  # the adapter is on again outside the reference
    # one copy of the base weights: the reference holds no parameter of its own
    assert {id(p) for p in models.ref.parameters()} == {id(p) for p in models.actor.parameters()}


def test_a_rank_8_version_of_the_small_preset_is_20x_smaller(tmp_path):
    rank = 8
    model_dir = init_tiny(tmp_path / "small", preset_spec("small"))
    full = build_models(TrainerSettings(model_dir=model_dir), _ctx(), fsdp=False).actor
    adapted = build_models(TrainerSettings(model_dir=model_dir, lora_rank=rank), _ctx(), fsdp=False).actor
    full_manifest = build_manifest(1, as_pairs(gather_weights(full, published_items(full))), 1, "crc32")
    lora_manifest = build_manifest(1, as_pairs(gather_weights(adapted, published_items(adapted))), 1, "crc32")
    assert full_manifest.total_bytes >= 20 * lora_manifest.total_bytes
    assert all(".lora_A." in t.name or ".lora_B." in t.name for t in lora_manifest.tensors)


def test_a_merged_adapter_on_the_tied_head_is_the_adapted_model(tiny_model_dir):
    # The tiny model's lm_head is its input embedding; merging the head's update into that shared
    # tensor would change the embedding as well.
    torch.manual_seed(0)
    spec = lora.LoraSpec(4, 8, ["q_proj", "lm_head"])
    adapted = lora.add_adapter(load_actor(tiny_model_dir, torch.device("cpu")), spec)
    with torch.no_grad():
        for _, param in lora.adapter_items(adapted):
            param.normal_(0, 0.2)
    adapter = {name: t.detach().clone() for name, t in lora.adapter_items(adapted)}
    merged = lora.merged_model(tiny_model_dir, adapter, lora.adapter_config(adapted))
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        expected = adapted(input_ids=ids).logits
        base = load_actor(tiny_model_dir, torch.device("cpu"))(input_ids=ids).logits
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, atol=1e-4, rtol=0)
    assert (expected - base).abs().max() > 1e-2  # the adapter changes the policy
