"""Fixtures shared by every test slice.

Tests under tests/unit, tests/integration and tests/e2e get the matching marker
automatically, so `pytest -m unit` runs the fast slice.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from relayrl.redis_process import RedisProcess

_SLICES = ("unit", "integration", "e2e")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for name in _SLICES:
            if name in parts:
                item.add_marker(getattr(pytest.mark, name))


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
