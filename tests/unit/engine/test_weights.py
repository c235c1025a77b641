"""The engine reads a weight directory as views of the mapped files and copies them into the
parameters once, or serves a whole version from the file itself; a file that does not fit the
model changes nothing."""

import struct

import pytest
import torch
from safetensors.torch import save_file

from services.engine.weights import apply_tensors, read_safetensors_dir
from tests.mappings import mapped_ranges


def tiny_model(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(7, 5), torch.nn.Linear(5, 3)).to(dtype)


def new_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: torch.randn_like(t) for name, t in model.state_dict().items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_applied_weights_equal_the_file_bit_for_bit(tmp_path, dtype):
    model = tiny_model(dtype)
    weights = new_weights(model)
    save_file(weights, str(tmp_path / "model.safetensors"))
    assert apply_tensors(model, read_safetensors_dir(tmp_path)) == len(weights)
    for name, tensor in model.state_dict().items():
        assert tensor.dtype == dtype and torch.equal(tensor.view(torch.int16), weights[name].view(torch.int16))


def test_tensors_are_views_into_the_mapped_file_not_copies(tmp_path):
    weights = {"h": torch.randn(5).to(torch.bfloat16), "w": torch.randn(64, 3), "s": torch.tensor(2.0)}
    path = tmp_path / "model.safetensors"
    save_file(weights, str(path))
    tensors = read_safetensors_dir(tmp_path)
    ranges = mapped_ranges(path)
    for name, tensor in tensors.items():
        assert torch.equal(tensor, weights[name])
        assert any(start <= tensor.data_ptr() < end for start, end in ranges), f"{name} was copied out of the file"
    # Writing through a view never reaches the file, which its writer may reuse (copy-on-write).
    before = path.read_bytes()
    tensors["w"].fill_(0)
    assert path.read_bytes() == before


def tied_model() -> torch.nn.Module:
    """An embedding whose output layer is the same parameter (Qwen2.5's tied lm_head)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(7, 5), torch.nn.Linear(5, 7, bias=False))
    model[1].weight = model[0].weight
    return model


def test_a_whole_version_served_in_place_is_the_file_s_memory_and_tied_names_follow(tmp_path):
    model = tied_model()
    # A version names each tensor once (the trainer's published_items), as here the embedding.
    weights = {"0.weight": torch.randn(7, 5)}
    path = tmp_path / "model.safetensors"
    save_file(weights, str(path))
    tensors = read_safetensors_dir(tmp_path)
    assert apply_tensors(model, tensors, in_place=True) == 1
    ranges = mapped_ranges(path)
    for name, param in model.named_parameters(remove_duplicate=False):
        assert any(start <= param.data_ptr() < end for start, end in ranges), f"{name} holds a copy"
        assert torch.equal(param, weights["0.weight"]), name
    tokens, table = torch.tensor([[1, 4]]), weights["0.weight"]
    assert torch.equal(model(tokens), torch.nn.functional.embedding(tokens, table) @ table.T)


def test_a_partial_update_or_another_dtype_is_copied_even_in_place(tmp_path):
    model = tiny_model(torch.float32)
    owned = {name: p.data_ptr() for name, p in model.named_parameters()}
    partial = {"1.weight": torch.randn(3, 5)}
    save_file(partial, str(tmp_path / "model.safetensors"))
    apply_tensors(model, read_safetensors_dir(tmp_path), in_place=True)
    assert model[1].weight.data_ptr() == owned["1.weight"], "a partial update must not spread the model over files"
    assert torch.equal(model[1].weight, partial["1.weight"])

    whole_bf16 = {name: t.to(torch.bfloat16) for name, t in new_weights(model).items()}
    save_file(whole_bf16, str(tmp_path / "model.safetensors"))
    apply_tensors(model, read_safetensors_dir(tmp_path), in_place=True)
    for name, param in model.named_parameters():
        assert param.dtype == torch.float32 and param.data_ptr() == owned[name], name
        assert torch.equal(param, whole_bf16[name].float()), name


@pytest.mark.parametrize(
    "damage",
    [
        lambda raw: raw[:-4],  # truncated data
        lambda raw: struct.pack("<Q", 10**9) + raw[8:],  # header longer than the file
        lambda raw: raw[:8] + b"[" + raw[9:],  # header not JSON
        lambda raw: b"",
    ],
)
def test_a_malformed_file_is_refused_and_the_model_keeps_its_weights(tmp_path, damage):
    model = tiny_model(torch.float32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    save_file(new_weights(model), str(tmp_path / "model.safetensors"))
    path = tmp_path / "model.safetensors"
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ValueError):
        apply_tensors(model, read_safetensors_dir(tmp_path))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_tensor_of_another_shape_is_refused_before_any_is_written(tmp_path):
    model = tiny_model(torch.float32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    weights = new_weights(model)
    weights["1.weight"] = torch.randn(4, 5)
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"1\.weight: shape"):
        apply_tensors(model, read_safetensors_dir(tmp_path))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
