"""Fixtures shared by every test slice.

Tests under tests/unit, tests/integration and tests/e2e get the matching marker
automatically, so `pytest -m unit` runs the fast slice; tests in an area's directory under a
slice (tests/unit/queue, tests/integration/engine, ...) get that area's marker, so `pytest -m queue`
runs one service's tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # One hook at the root: a conftest's hook sees every collected item, not only its directory's.
    for item in items:
        parts = Path(str(item.fspath)).relative_to(TESTS).parts
        if parts[0] in _SLICES:
            item.add_marker(getattr(pytest.mark, parts[0]))
            if parts[0] == "e2e":
                # `make test` runs two xdist workers with --dist loadgroup: whole-stack runs go one at a
                # time on one worker, beside the unit and integration tests on the other, so no two
                # stacks (each wanting both cores) ever share the machine.
                item.add_marker(pytest.mark.xdist_group("e2e"))
            elif parts[0] == "integration":
                # An integration module's tests share its module-scoped fixtures (a whole observed
                # stack, a trained model): split across the workers, each worker would build them again.
                item.add_marker(pytest.mark.xdist_group("/".join(parts)))
            if len(parts) > 2 and parts[1] in _AREAS:
                item.add_marker(getattr(pytest.mark, _AREAS[parts[1]]))


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
