"""The single-copy weight path end to end in one process: a real paramsync serves a published
version, a replica's client receives it straight into a safetensors file in /dev/shm, and the
engine's loader maps that file and copies it into the model: the parameters then equal the
published tensors bit for bit, in fp32 and bf16, over the data plane and over gRPC streams."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from relayrl.models.loading import load_causal_lm
from services.engine.weights import apply_tensors, read_safetensors_dir
from services.paramsync.client import ParamSyncClient
from services.paramsync.memfile import VersionFiles
from tests.integration.paramsync.harness import running_service

SHM = Path("/dev/shm")


def new_values(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Random values for every tensor; tied tensors (the tiny model's embeddings) get the same ones."""
    torch.manual_seed(1)
    by_storage: dict[int, torch.Tensor] = {}
    return {name: by_storage.setdefault(t.data_ptr(), torch.randn_like(t)) for name, t in model.state_dict().items()}


@pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm on this machine")
@pytest.mark.parametrize("data_plane", [True, False], ids=["dataplane", "grpc"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
async def test_applied_parameters_equal_the_published_tensors_bit_for_bit(
    tiny_model_dir: Path, tmp_path: Path, dtype: str, data_plane: bool
) -> None:
    model = load_causal_lm(tiny_model_dir, dtype=dtype)
    published = new_values(model)
    files = VersionFiles(SHM / f"relayrl-test-{tmp_path.name}")
    try:
        async with running_service() as (address, _), ParamSyncClient(address, data_plane=data_plane) as ps:
            await ps.publish(1, published)
            directory = await ps.fetch_to_file(1, files, "r0")
        assert directory.parent == files.root, "the version lands in shared memory, not on disk"
        assert apply_tensors(model, read_safetensors_dir(directory)) == len(published)
    finally:
        files.close()
    bits = torch.int16 if dtype == "bfloat16" else torch.int32
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor.view(bits), published[name].view(bits)), name
