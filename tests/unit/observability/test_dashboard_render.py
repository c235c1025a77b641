"""``docs.gen.dashboards`` draws a committed dashboard from Prometheus's range-query answers.

The Prometheus here is a fake HTTP server speaking the two routes the renderer calls
(``/api/v1/status/tsdb`` and ``/api/v1/query_range``) with canned answers; it records every query
it is sent.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar
from urllib.parse import parse_qs, urlsplit

import pytest

from docs.gen import dashboards
from docs.gen.ops import DASHBOARDS, image_of
from tests.http_answers import send_json

START_S = 1_700_000_000.0
END_S = START_S + 600


def _matrix(metric: dict[str, str], n: int = 20) -> dict:
    step = (END_S - START_S) / n
    return {"metric": metric, "values": [[START_S + i * step, str(float(i))] for i in range(n)]}


class FakePrometheus(BaseHTTPRequestHandler):
    queries: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/api/v1/status/tsdb":
            head = {"minTime": int(START_S * 1000), "maxTime": int(END_S * 1000), "numSeries": 3}
            self._answer(200, {"status": "success", "data": {"headStats": head}})
        elif url.path == "/api/v1/query_range":
            query = parse_qs(url.query)["query"][0]
            self.queries.append(query)
            if "relayrl_paramsync_latest_version" in query:
                self._answer(200, {"status": "success", "data": {"resultType": "matrix", "result": [_matrix({})]}})
            elif "relayrl_rollout_weight_version" in query:
                result = [_matrix({"instance": "rollout-0"}), _matrix({"instance": "rollout-1"})]
                self._answer(200, {"status": "success", "data": {"resultType": "matrix", "result": result}})
            elif "relayrl_queue_queue_size_groups" in query:
                self._answer(400, {"status": "error", "errorType": "bad_data", "error": "parse error"})
            else:
                self._answer(200, {"status": "success", "data": {"resultType": "matrix", "result": []}})
        else:
            self._answer(404, {"status": "error", "error": "not found"})

    def _answer(self, code: int, body: dict) -> None:
        send_json(self, code, body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def prometheus() -> Iterator[str]:
    FakePrometheus.queries = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakePrometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_dashboard_is_drawn_panel_by_panel_from_substituted_queries(prometheus: str, tmp_path: Path) -> None:
    path = DASHBOARDS / "relayrl-overview.json"
    board = json.loads(path.read_text())
    client = dashboards.Prometheus(prometheus)
    span = client.span(scrape_s=5.0)
    out = tmp_path / image_of(path).name

    drawn = dashboards.render(board, lambda e: client.query_range(dashboards.substitute(e, span), span), span, out)

    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size < 300_000
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert [d.title for d in drawn] == [p["title"] for p in panels]
    # Every query reached Prometheus with Grafana's variables filled in: the span is 600 s, so the step
    # is 5 s and $__rate_interval is 4 × the scrape interval.
    sent = FakePrometheus.queries
    assert len(sent) == sum(len(p["targets"]) for p in panels)
    assert not [q for q in sent if "$" in q]
    assert any("[20s]" in q for q in sent)
    by_title = {d.title: d for d in drawn}
    assert by_title["Policy version"].series == 1
    assert by_title["Weight versions"].series == 3  # the latest, and one per replica
    # A panel whose queries return nothing is drawn as "No data", one whose query fails says so.
    assert by_title["Reward service"].series == 0 and not by_title["Reward service"].error
    assert by_title["Queued groups"].series == 0 and "parse error" in by_title["Queued groups"].error


def test_grafana_variables_and_legends() -> None:
    span = dashboards.Span(START_S, START_S + 3600, step_s=15.0, scrape_s=5.0)
    assert dashboards.substitute("rate(x[$__rate_interval])", span) == "rate(x[20s])"
    assert dashboards.substitute("avg_over_time(x[${__range}])", span) == "avg_over_time(x[3600s])"
    with pytest.raises(ValueError, match=r"\$job"):
        dashboards.substitute('up{job="$job"}', span)
    assert dashboards.legend("p95 {{tool}}", {"tool": "calc"}) == "p95 calc"
    assert dashboards.legend(None, {"__name__": "up", "job": "queue"}) == 'up{job="queue"}'
    assert dashboards.format_value(0.25, "percentunit") == "25%"
    assert dashboards.format_value(0.02, "s") == "20 ms"
