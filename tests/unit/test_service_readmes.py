"""Each service's README names every one of its modules, so a reader finds any behaviour's home."""

from __future__ import annotations

from pathlib import Path

import pytest

SERVICES = Path(__file__).resolve().parents[2] / "services"


def _parts(service: Path) -> list[str]:
    modules = [p.name for p in service.glob("*.py") if p.stem not in ("__init__", "__main__")]
    packages = [f"{p.name}/" for p in service.iterdir() if (p / "__init__.py").is_file()]
    return sorted(modules + packages)


@pytest.mark.parametrize("service", sorted(p.name for p in SERVICES.iterdir() if (p / "__init__.py").is_file()))
def test_the_readme_names_every_module(service: str) -> None:
    readme = SERVICES / service / "README.md"
    assert readme.is_file(), f"services/{service} has no README.md"
    text = readme.read_text()
    assert [part for part in _parts(SERVICES / service) if f"`{part}`" not in text] == []
