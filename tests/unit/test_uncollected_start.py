"""A service starts with the garbage collector off and leaves what it built out of later collections."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from relayrl.serving import uncollected_start


@pytest.fixture
def unfrozen() -> Iterator[None]:
    yield
    # The frozen objects go back to the collector: this process is the test runner's.
    gc.unfreeze()


@pytest.mark.usefixtures("unfrozen")
def test_the_collector_is_off_during_start_up_and_back_after_with_the_start_up_heap_frozen() -> None:
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    with uncollected_start():
        assert not gc.isenabled()
        built = [[] for _ in range(1000)]
    assert gc.isenabled()
    assert gc.get_freeze_count() >= frozen + len(built)


@pytest.mark.usefixtures("unfrozen")
def test_a_nested_start_up_leaves_the_collector_to_the_outer_one() -> None:
    with uncollected_start():
        with uncollected_start():
            pass
        assert not gc.isenabled()
    assert gc.isenabled()


@pytest.mark.usefixtures("unfrozen")
def test_an_error_during_start_up_turns_the_collector_back_on() -> None:
    with pytest.raises(RuntimeError), uncollected_start():
        raise RuntimeError("start failed")
    assert gc.isenabled()
