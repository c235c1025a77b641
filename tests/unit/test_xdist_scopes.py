"""How `make test` shares tests out between its two xdist workers (tests/conftest.py)."""

from tests.conftest import xdist_scope


def test_every_e2e_test_shares_one_scope_and_an_integration_module_is_one() -> None:
    assert xdist_scope("tests/e2e/test_chaos.py::test_a") == xdist_scope("tests/e2e/test_stack.py::test_b") == "e2e"
    observed = "tests/integration/observability/test_prometheus_stack.py"
    assert xdist_scope(f"{observed}::test_a") == xdist_scope(f"{observed}::test_b") == observed
    assert xdist_scope("tests/integration/queue/test_prompts.py::test_a") != observed
    # Unit tests go one by one.
    assert xdist_scope("tests/unit/queue/test_keys.py::test_a") != xdist_scope("tests/unit/queue/test_keys.py::test_b")
