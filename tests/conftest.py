"""Fixtures shared by every test slice.

Tests under tests/unit, tests/integration and tests/e2e get the matching marker
automatically, so `pytest -m unit` runs the fast slice; tests in an area's directory under a
slice (tests/unit/queue, tests/integration/engine, ...) get that area's marker, so `pytest -m queue`
runs one service's tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from relayrl.forkserver import ENV_VARIABLE as FORKSERVER_VARIABLE
from relayrl.forkserver import ForkServer
from relayrl.forkserver import usable as forkserver_usable
from relayrl.redis_process import RedisProcess

TESTS = Path(__file__).parent
_SLICES = ("unit", "integration", "e2e")
# Directory under a slice → area marker. The built-in engine is tested with the rollout, its client.
_AREAS = {
    "deploy": "deploy",
    "engine": "rollout",
    "observability": "observability",
    "paramsync": "paramsync",
    "queue": "queue",
    "rollout": "rollout",
    "trainer": "trainer",
}


def _no_cuda_reason() -> str | None:
    """Why `gpu` tests cannot run here, or None where they can."""
    import torch

    if not torch.cuda.is_available():
        return f"needs a CUDA device; torch {torch.__version__} sees none (run `make test-gpu` on a GPU host)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # One hook at the root: a conftest's hook sees every collected item, not only its directory's.
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    reason = _no_cuda_reason() if gpu_items else None
    for item in gpu_items:
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
    for item in items:
        parts = Path(str(item.fspath)).relative_to(TESTS).parts
        if parts[0] in _SLICES:
            item.add_marker(getattr(pytest.mark, parts[0]))
            if len(parts) > 2 and parts[1] in _AREAS:
                item.add_marker(getattr(pytest.mark, _AREAS[parts[1]]))


E2E_SCOPE = "e2e"


def xdist_scope(nodeid: str) -> str:
    """The unit of work `make test`'s xdist workers share out (tests of one scope run on one worker).

    - every e2e test is one scope: whole-stack runs go one at a time on one worker, beside the other
      tests on the other, so no two stacks (each wanting both cores) ever share the machine;
    - an integration module is one scope: its tests share module fixtures (a whole observed stack,
      a trained model) that a second worker would build again;
    - a unit test is its own scope.
    """
    path = nodeid.split("::", 1)[0]
    parts = Path(path).parts
    if len(parts) > 1 and parts[1] == "e2e":
        return E2E_SCOPE
    if len(parts) > 1 and parts[1] == "integration":
        return path
    return nodeid


def scope_scheduler() -> type:
    """xdist's LoadScopeScheduling over :func:`xdist_scope`'s scopes, the e2e scope handed out first."""
    from xdist.scheduler import LoadScopeScheduling

    class ByScope(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            # xdist hands out the scopes with the most tests first, but the e2e scope is the longest to
            # run whatever its count (whole stacks, one after another): behind modules of many quick
            # tests it would start late and run on alone at the end while the other worker idles.
            if E2E_SCOPE in self.workqueue:
                self.workqueue.move_to_end(E2E_SCOPE, last=False)
            super()._assign_work_unit(node)

    return ByScope


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    # xdist's own loadgroup cannot group under pytest 9: it tags each node id with its group by
    # assigning ``item._nodeid``, which pytest 9 no longer reads, so every test went its own way
    # (e2e stacks ran two at a time, module fixtures were built once per worker).
    return scope_scheduler()(config, log)


@pytest.fixture(scope="session", autouse=True)
def fork_server(request: pytest.FixtureRequest) -> Iterator[None]:
    """Python services the tests start are forked from one server per worker that imported torch
    and transformers once (:mod:`relayrl.forkserver`), as ``relayrl up`` forks its components:
    each start then costs a fork, not 7 s of imports. A session of unit tests only starts none."""
    if not forkserver_usable() or all(item.get_closest_marker("unit") for item in request.session.items):
        yield
        return
    server = ForkServer(wait=False)
    os.environ[FORKSERVER_VARIABLE] = str(server.path)
    try:
        yield
    finally:
        os.environ.pop(FORKSERVER_VARIABLE, None)
        server.stop()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 model and tokenizer written once per test session (read-only for tests)."""
    from relayrl.models.tiny import init_tiny

    return init_tiny(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisProcess]:
    """A real redis-server on a free loopback port with AOF on, stopped after the test."""
    server = RedisProcess(data_dir=tmp_path / "redis").start()
    yield server
    server.stop()


@pytest.fixture
def file_system_sharing() -> Iterator[None]:
    """CPU tensors shared by file name, which another process (an engine) may open, as a trainer on
    the engine's host shares them (torch's default shares by descriptor, which only children open)."""
    import torch.multiprocessing

    before = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy("file_system")
    yield
    torch.multiprocessing.set_sharing_strategy(before)
