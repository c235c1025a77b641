"""Answers of the fake HTTP servers tests run (`http.server` handlers speaking another service's API)."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any


def send_json(handler: BaseHTTPRequestHandler, code: int, body: dict[str, Any]) -> None:
    """``body`` as a complete JSON response with its length, as the real APIs answer."""
    data = json.dumps(body).encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
