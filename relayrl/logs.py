"""Structured logging for every service: one line per event, text for people or JSON for shippers."""

from __future__ import annotations

import logging
import sys

from pythonjsonlogger.json import JsonFormatter

TEXT_FORMAT = "%(asctime)s %(levelname)-5s %(service)s %(name)s: %(message)s"


class _ServiceFilter(logging.Filter):
    """Stamps every record with the service name so merged logs stay attributable."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def filter(self, record: logging.LogRecord) -> bool:
        record.service = self.service
        return True


def setup_logging(service: str, level: str = "INFO", fmt: str = "text") -> None:
    """Configures the root logger once, at a service's entry point."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_ServiceFilter(service))
    if fmt == "json":
        handler.setFormatter(JsonFormatter("%(asctime)s %(levelname)s %(service)s %(name)s %(message)s"))
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # gRPC and HTTP libraries are chatty at INFO; their warnings still come through.
    for noisy in ("httpx", "httpcore", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
