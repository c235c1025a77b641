"""``relayrl up --monitor``: a local Prometheus scraping every component of the run, with
RelayRL's alert rules, so the repository's Grafana dashboards have a data source to point at."""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from commands.stack.launch import HOST, LocalStack
from commands.stack.process import ComponentError, ComponentSpec, http_ready
from relayrl.net import free_port

RULES_FILE = Path(__file__).resolve().parents[2] / "observability" / "alerts" / "relayrl-rules.yaml"
SCRAPE_INTERVAL_S = 5


def prometheus_config(services: dict[str, str], rule_files: list[Path]) -> dict:
    """One job per component kind (queue, trainer, rollout, ...), one target per component."""
    jobs: dict[str, list[str]] = {}
    for name, url in services.items():
        jobs.setdefault(name.split("-")[0], []).append(urlsplit(url).netloc)
    return {
        "global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s", "evaluation_interval": f"{SCRAPE_INTERVAL_S}s"},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": t}]} for job, t in jobs.items()],
    }


def start_prometheus(stack: LocalStack) -> str:
    """Starts Prometheus under the stack's supervisor once every component is up; returns its URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise ComponentError(
            "prometheus", "not found on PATH", hint="apt-get install prometheus, or leave out --monitor"
        )
    workdir = stack.run_dir / "prometheus"
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / "prometheus.yml"
    rules = [RULES_FILE] if RULES_FILE.is_file() else []
    config_file.write_text(yaml.safe_dump(prometheus_config(stack.endpoints.http_services(), rules)))
    port = free_port(HOST)
    url = f"http://{HOST}:{port}"
    stack.supervisor.start(
        ComponentSpec(
            name="prometheus",
            argv=[
                binary,
                f"--config.file={config_file}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address={HOST}:{port}",
                "--log.level=warn",
            ],
            ready=http_ready(f"{url}/-/ready"),
            ready_timeout_s=stack.settings.ready_timeout_s,
            log_file=stack.run_dir / "logs" / "prometheus.log",
        )
    )
    return url
