"""Every HTTP client shares one TLS context per process (relayrl/http_client.py says why)."""

from __future__ import annotations

import ast
from pathlib import Path

from relayrl import http_client

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("relayrl", "services", "commands", "docs", "scripts", "tests")
CONSTRUCTORS = {"Client", "AsyncClient"}


def _constructor_calls(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        func = node.func if isinstance(node, ast.Call) else None
        if (
            isinstance(func, ast.Attribute)
            and func.attr in CONSTRUCTORS
            and isinstance(func.value, ast.Name)
            and func.value.id == "httpx"
        ):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} httpx.{func.attr}(...)")
    return found


def test_no_code_builds_an_httpx_client_but_through_relayrl_http_client() -> None:
    own = ROOT / "relayrl" / "http_client.py"
    calls = [
        call
        for top in SOURCES
        for path in sorted((ROOT / top).rglob("*.py"))
        if path != own and "relayrl/v1" not in path.as_posix()
        for call in _constructor_calls(path)
    ]
    assert calls == [], "build clients with relayrl.http_client.client / async_client:\n" + "\n".join(calls)


async def test_clients_of_both_kinds_share_the_one_context() -> None:
    shared = http_client.tls_context()
    with http_client.client() as sync:
        assert sync._transport._pool._ssl_context is shared
    async with http_client.async_client() as asynchronous:
        assert asynchronous._transport._pool._ssl_context is shared
