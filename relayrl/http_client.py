"""HTTP clients, made the one way every service, command and test makes them: sharing one TLS
context per process.

httpx builds a new TLS context for every client it creates, ``httpx.get`` included, and with it
parses certifi's whole CA bundle: about 50 ms of CPU each time on a 2-core machine, for a
plain-http call to a local service as much as for an https one. Readiness probes, progress polls
and tests' waits make such calls several times a second, so a stack start spent seconds of CPU on
certificates it never used. The context here is the one httpx would build (certifi, or
``SSL_CERT_FILE``/``SSL_CERT_DIR`` when set), built once; an ``SSLContext`` may serve any number of
clients and threads.
"""

from __future__ import annotations

import functools
import ssl
from typing import Any

import httpx


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default TLS context, built on first use."""
    return httpx.create_ssl_context()


def client(**kwargs: Any) -> httpx.Client:
    """An ``httpx.Client`` (same arguments) using the shared TLS context."""
    return httpx.Client(verify=tls_context(), **kwargs)


def async_client(**kwargs: Any) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` (same arguments) using the shared TLS context."""
    return httpx.AsyncClient(verify=tls_context(), **kwargs)


def get(url: str, **kwargs: Any) -> httpx.Response:
    """``httpx.get`` (same arguments) using the shared TLS context."""
    return httpx.get(url, verify=tls_context(), **kwargs)  # noqa: TID251


def post(url: str, **kwargs: Any) -> httpx.Response:
    """``httpx.post`` (same arguments) using the shared TLS context."""
    return httpx.post(url, verify=tls_context(), **kwargs)  # noqa: TID251
