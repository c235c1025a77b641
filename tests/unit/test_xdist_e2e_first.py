"""`make test`'s xdist scheduler hands the e2e scope out first, whatever its number of tests."""

from __future__ import annotations

from types import SimpleNamespace

from tests.conftest import scope_scheduler


class _Worker:
    """What the scheduler calls on a worker: the indexes of the tests it is sent."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.sent: list[list[int]] = []
        self.shutting_down = False

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.append(indexes)

    def shutdown(self) -> None:
        self.shutting_down = True


def _config(workers: int) -> SimpleNamespace:
    values = {"tx": [f"{workers}*popen"]}
    return SimpleNamespace(getvalue=values.__getitem__, option=SimpleNamespace(loadscopereorder=True))


def test_the_e2e_scope_goes_to_a_worker_before_modules_with_more_tests() -> None:
    many = [f"tests/integration/deploy/test_chart.py::test_{i}" for i in range(30)]
    more = [f"tests/integration/queue/test_bad_input.py::test_{i}" for i in range(25)]
    e2e = ["tests/e2e/test_chaos.py::test_a", "tests/e2e/test_stack.py::test_b"]
    collection = [*e2e, *many, *more, "tests/unit/test_one.py::test_c"]
    scheduler = scope_scheduler()(_config(2))
    workers = [_Worker("gw0"), _Worker("gw1")]
    for worker in workers:
        scheduler.add_node(worker)
        scheduler.add_node_collection(worker, collection)
    scheduler.schedule()

    first_units = [[collection[i] for i in worker.sent[0]] for worker in workers]
    assert e2e in first_units, first_units
    # The other worker starts on the scope with the most tests, as xdist orders the rest.
    assert many in first_units, first_units
