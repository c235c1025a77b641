"""A real Prometheus server (Debian's ``prometheus`` binary) for tests: its own temp directory,
loopback only, a 1 s scrape interval, the RelayRL alert rules loaded, and a small client for
its HTTP API."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from relayrl import http_client
from relayrl.net import free_port
from relayrl.subprocesses import stop_process
from tests.waiting import WaitTimeout, wait_until

SCRAPE_INTERVAL_S = 1
# What Grafana's $__rate_interval becomes at this scrape interval: at least four scrapes.
RATE_INTERVAL = "10s"


class PrometheusError(RuntimeError):
    pass


@dataclass
class QueryResult:
    expr: str
    series: list[dict[str, Any]]

    @property
    def has_data(self) -> bool:
        return any(s.get("values") or s.get("value") for s in self.series)


class PrometheusServer:
    def __init__(self, workdir: Path, targets: Mapping[str, Sequence[str]], rule_files: Sequence[Path] = ()) -> None:
        """``targets``: job name → ``host:port`` addresses whose ``/metrics`` are scraped."""
        binary = shutil.which("prometheus")
        if binary is None:
            raise PrometheusError("prometheus is missing: `make setup` installs Debian's prometheus package")
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {
                "scrape_interval": f"{SCRAPE_INTERVAL_S}s",
                "scrape_timeout": f"{SCRAPE_INTERVAL_S}s",
                "evaluation_interval": f"{SCRAPE_INTERVAL_S}s",
            },
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": list(addresses)}]}
                for job, addresses in targets.items()
            ],
        }
        config_file = workdir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config))
        self._log = (workdir / "prometheus.log").open("w")
        self._argv = [
            binary,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        self._process: subprocess.Popen[bytes] | None = None
        self._http = http_client.client(base_url=self.url, timeout=10)

    def start(self, timeout_s: float = 30) -> PrometheusServer:
        self._process = subprocess.Popen(self._argv, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            wait_until(self._ready, timeout_s, "prometheus to be ready", poll_s=0.1)
        except WaitTimeout as exc:
            raise PrometheusError(f"{exc}: {self.log_tail()}") from exc
        return self

    def _ready(self) -> bool:
        assert self._process is not None
        if self._process.poll() is not None:
            raise PrometheusError(f"prometheus exited with {self._process.returncode}: {self.log_tail()}")
        try:
            return self._http.get("/-/ready").status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        self._http.close()
        if self._process is not None:
            stop_process(self._process)
        self._log.close()

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join((self.workdir / "prometheus.log").read_text().splitlines()[-lines:])

    def _api(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        response = self._http.get(f"/api/v1/{path}", params=params)
        body = response.json()
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query_range(self, expr: str, seconds: float, step_s: float = SCRAPE_INTERVAL_S) -> QueryResult:
        """Runs ``expr`` as Grafana would (a range query); raises PrometheusError if it does not evaluate."""
        now = time.time()
        data = self._api("query_range", {"query": expr, "start": now - seconds, "end": now, "step": step_s})
        return QueryResult(expr, data["result"])

    def query(self, expr: str) -> QueryResult:
        return QueryResult(expr, self._api("query", {"query": expr})["result"])

    def targets(self) -> list[dict[str, Any]]:
        return self._api("targets")["activeTargets"]

    def rules(self) -> list[dict[str, Any]]:
        return [rule for group in self._api("rules")["groups"] for rule in group["rules"]]


def grafana_to_promql(expr: str) -> str:
    """Replaces the Grafana variables our dashboards use with what Grafana would send."""
    return expr.replace("$__rate_interval", RATE_INTERVAL)
