"""The single-copy weight path end to end in one process: a real paramsync serves a published
version, a replica's client receives it straight into a safetensors file in /dev/shm, and the
engine's loader maps that file and copies it into the model: the parameters then equal the
published tensors bit for bit, in fp32 and bf16, over the data plane and over gRPC streams. Served
in place (the stack's engines), the parameters are the file, and the replica's reuse of older
files never changes the version the engine serves."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from relayrl.models.loading import load_causal_lm
from services.engine.weights import apply_tensors, read_safetensors_dir
from services.paramsync.client import ParamSyncClient
from services.paramsync.memfile import VersionFiles
from tests.integration.paramsync.harness import running_service
from tests.mappings import mapped_ranges

SHM = Path("/dev/shm")


def new_values(model: torch.nn.Module, seed: int = 1) -> dict[str, torch.Tensor]:
    """Random values for every tensor; tied tensors (the tiny model's embeddings) get the same ones."""
    torch.manual_seed(seed)
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


def assert_serves(model: torch.nn.Module, values: dict[str, torch.Tensor]) -> None:
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, values[name]), name


def in_file(tensor: torch.Tensor, path: Path) -> bool:
    return any(start <= tensor.data_ptr() < end for start, end in mapped_ranges(path))


@pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm on this machine")
async def test_versions_served_in_place_do_not_change_while_the_next_is_received(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    # The replica's way (services/rollout/weight_sync.py): two files kept, each version received
    # into a file older than the one the engine serves, then served in place, then older ones pruned.
    model = load_causal_lm(tiny_model_dir, dtype="float32")
    files = VersionFiles(SHM / f"relayrl-test-{tmp_path.name}", keep=2)
    held, served = 0, {}
    try:
        async with running_service() as (address, _), ParamSyncClient(address) as ps:
            for version in range(1, 6):
                published = new_values(model, seed=version)
                await ps.publish(version, published)
                directory = await ps.fetch_to_file(version, files, "r0", reusable_below=held)
                if served:
                    assert_serves(model, served)
                apply_tensors(model, read_safetensors_dir(directory), in_place=True)
                held, served = version, published
                files.prune()
                assert_serves(model, served)
                (path,) = directory.glob("*.safetensors")
                assert all(in_file(p, path) for p in model.parameters()), "the parameters are the file"
    finally:
        files.close()
    assert_serves(model, served)
