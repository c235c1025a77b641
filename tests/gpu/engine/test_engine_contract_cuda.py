"""The engine's contract tests (``tests/integration/rollout/test_engine.py``: SGLang's native API, its
fields and types, log-probs, batching, ``n``, pause in its three modes, SIGTERM, the weight routes,
the prefix cache across updates, the pause timings, bad requests) against the CUDA engine: the same
test functions, their engines started with ``RELAYRL_ENGINE_DEVICE=cuda`` (float32, so log-probs
match a plain forward pass on the CPU as closely as the CPU engine's do; CUDA graphs on).

Left out, with the reason: serving versions from their files under ``shared_weights_dir``, which
the CUDA engine ignores by design (every version is copied into the GPU's parameters; the engine
logs it at start).

Run with ``make test-gpu``; skipped without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from relayrl.net import free_port
from tests.integration.rollout import test_engine as contract
from tests.integration.rollout.conftest import EngineProcess, engines_started

pytestmark = pytest.mark.gpu

CUDA = {
    "RELAYRL_ENGINE_DEVICE": "cuda",
    "RELAYRL_ENGINE_DTYPE": "float32",
    "RELAYRL_ENGINE_CUDA_GRAPH_MAX_BS": "16",
    # A cache of its own size: the SIGTERM test starts a second engine beside the module's.
    "RELAYRL_ENGINE_MAX_TOTAL_TOKENS": "65536",
}
NOT_ON_CUDA = {"test_versions_under_the_shared_weights_dir_are_served_from_their_files"}

# Collected here too, so they run with this module's fixtures: a CUDA engine.
for _name in dir(contract):
    if _name.startswith("test_") and _name not in NOT_ON_CUDA:
        globals()[_name] = getattr(contract, _name)


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[EngineProcess]:
    proc = EngineProcess(tiny_model_dir, free_port(), settings=CUDA).start(timeout_s=300)
    yield proc
    proc.stop()


@pytest.fixture
def start_engine(tiny_model_dir: Path) -> Iterator[Callable[..., EngineProcess]]:
    with engines_started(tiny_model_dir, CUDA, timeout_s=300) as start:
        yield start


def test_the_contract_runs_on_the_cuda_engine(engine: EngineProcess) -> None:
    import asyncio

    from services.engine.client import EngineClient

    async def info() -> dict:
        async with EngineClient(engine.url) as client:
            return await client.model_info()

    seen = asyncio.run(info())
    assert seen["device"].startswith("cuda") and seen["cuda_graph_batch_sizes"]
