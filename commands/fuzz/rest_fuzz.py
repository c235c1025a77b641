"""REST fuzzing of one service from its own OpenAPI schema, with schemathesis.

Each operation gets schema-valid and schema-violating requests (with the bearer token, so the
handlers behind it are reached). A 5xx counts as unexplained unless the route documents it
(/readyz answers 503 while the service cannot do its job); a request with no answer within
the timeout is a hang.
"""

from __future__ import annotations

import contextlib
from typing import Any

import requests

from commands.fuzz.report import Tally

TIMEOUT_S = 30.0
# (path, status): 5xx answers that are the route's contract, not a fault.
EXPLAINED_5XX = frozenset({("/readyz", 503)})
# Routes that stop or reshape the service under test, or act outside it (the engine's profiler writes
# its files wherever a request's output_dir says, as SGLang's does); fuzzing them would end the run or
# litter the machine, not test the service.
SKIPPED = frozenset(
    {
        ("POST", "/destroy_weights_update_group"),
        *((method, path) for method in ("GET", "POST") for path in ("/start_profile", "/stop_profile")),
    }
)


def fuzz_rest(base_url: str, api_token: str, examples: int, seed: int, tally: Tally) -> None:
    """``examples`` generated requests per operation and generation mode (valid, then invalid)."""
    import schemathesis
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    client = _Client(base_url, {"Authorization": f"Bearer {api_token}"}, tally)
    for result in schema.get_all_operations():
        operation = result.ok()
        if (operation.method.upper(), operation.path) in SKIPPED:
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _fuzz_operation(client, operation, mode, examples, seed)


class _Client:
    def __init__(self, base_url: str, headers: dict[str, str], tally: Tally) -> None:
        self.base_url = base_url
        self.headers = headers
        self.session = requests.Session()
        self.tally = tally

    def send(self, case: Any, label: str) -> None:
        tally = self.tally
        where = f"{case.method} {case.formatted_path} ({label})"
        tally.calls += 1
        try:
            response = case.call(base_url=self.base_url, session=self.session, headers=self.headers, timeout=TIMEOUT_S)
        except requests.Timeout:
            tally.by_status["timeout"] += 1
            tally.fail("hangs", where)
            return
        except requests.ConnectionError as exc:
            tally.by_status["connection_error"] += 1
            tally.fail("crashes", f"{where}: {exc}")
            return
        tally.by_status[str(response.status_code)] += 1
        if response.status_code >= 500 and (case.operation.path, response.status_code) not in EXPLAINED_5XX:
            tally.fail("unexplained", f"{where} -> {response.status_code} {response.text[:200]}")


def _fuzz_operation(client: _Client, operation: Any, mode: Any, examples: int, seed: int) -> None:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis.errors import Unsatisfiable

    @hypothesis_seed(seed)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        client.send(case, mode.value)

    # An operation without parameters or body has no invalid request to make.
    with contextlib.suppress(Unsatisfiable):
        run()
