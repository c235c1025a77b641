import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "observability" in item.nodeid:
            item.add_marker(pytest.mark.observability)
