"""Stand-ins for what cannot run here: a Kubernetes API server.

Faked: ``FakeKubeAPI`` is a real HTTP server (a thread on a free loopback port) serving only
``GET /apis/discovery.k8s.io/v1/namespaces/<ns>/endpointslices``, as the kube-apiserver does:

- list: an ``EndpointSliceList`` with ``metadata.resourceVersion``; ``labelSelector`` supports
  equality terms (``a=b,c=d``), which is all discovery uses;
- ``watch=true``: a chunked response of newline-delimited JSON events (``ADDED``, ``MODIFIED``,
  ``DELETED``, ``BOOKMARK`` when ``allowWatchBookmarks=true``) for changes after the requested
  ``resourceVersion``; a version older than the compaction point gets an ``ERROR`` event with a
  ``410 Expired`` Status, like etcd compaction; ``timeoutSeconds`` ends the stream.

Objects are plain JSON in the ``discovery.k8s.io/v1`` shape (the tests validate them against the
Kubernetes schema). Not faked: authentication, other resources, field selectors, protobuf.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from relayrl.net import free_port
from tests.http_answers import send_json


def endpoint_slice(
    name: str,
    service: str,
    pods: dict[str, str],
    *,
    namespace: str = "default",
    not_ready: frozenset[str] = frozenset(),
    engine_port: int = 30000,
) -> dict[str, Any]:
    """An EndpointSlice as the EndpointSlice controller writes it: ``pods`` maps pod name → IP."""
    return {
        "kind": "EndpointSlice",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "generateName": f"{service}-",
            "labels": {
                "kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                "app.kubernetes.io/component": "rollout",
            },
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "name": service,
                    "uid": "5a1c0b6e-0000-4000-8000-000000000001",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "addressType": "IPv4",
        "endpoints": [
            {
                "addresses": [ip],
                "conditions": {"ready": pod not in not_ready, "serving": pod not in not_ready, "terminating": False},
                "targetRef": {"kind": "Pod", "namespace": namespace, "name": pod, "uid": f"uid-{pod}"},
                "nodeName": "gpu-node-1",
            }
            for pod, ip in pods.items()
        ],
        "ports": [
            {"name": "grpc", "protocol": "TCP", "port": 50053, "appProtocol": "grpc"},
            {"name": "http", "protocol": "TCP", "port": 8080},
            {"name": "engine", "protocol": "TCP", "port": engine_port},
        ],
    }


@dataclass
class _Event:
    resource_version: int
    type: str
    obj: dict[str, Any]


class FakeKubeAPI:
    """The EndpointSlice part of a kube-apiserver; mutate with put/delete, observe with ``requests``."""

    def __init__(self, namespace: str = "default", port: int | None = None) -> None:
        self.namespace = namespace
        self._lock = threading.Condition()
        self._objects: dict[str, dict[str, Any]] = {}
        self._events: list[_Event] = []
        self._resource_version = 100
        self._compacted_below = 0
        self._closing = False
        self.requests: list[dict[str, list[str]]] = []
        self.port = port or free_port()
        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeKubeAPI:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    # -- state changes, each one resourceVersion and one watch event, as in etcd ---------------

    def put(self, obj: dict[str, Any]) -> int:
        with self._lock:
            name = obj["metadata"]["name"]
            kind = "MODIFIED" if name in self._objects else "ADDED"
            return self._record(kind, obj)

    def delete(self, name: str) -> int:
        with self._lock:
            return self._record("DELETED", self._objects[name])

    def compact(self) -> None:
        """Forgets history: watches from any version seen so far get 410 Gone."""
        with self._lock:
            self._compacted_below = self._resource_version + 1

    def _record(self, kind: str, obj: dict[str, Any]) -> int:
        self._resource_version += 1
        stored = json.loads(json.dumps(obj))
        stored["metadata"]["resourceVersion"] = str(self._resource_version)
        if kind == "DELETED":
            self._objects.pop(stored["metadata"]["name"], None)
        else:
            self._objects[stored["metadata"]["name"]] = stored
        self._events.append(_Event(self._resource_version, kind, stored))
        self._lock.notify_all()
        return self._resource_version

    def watchers(self) -> int:
        """How many watch requests have been made (to see reconnects)."""
        return sum(1 for query in self.requests if query.get("watch") == ["true"])

    # -- HTTP -----------------------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                url = urlparse(self.path)
                query = parse_qs(url.query)
                api.requests.append(query)
                expected = f"/apis/discovery.k8s.io/v1/namespaces/{api.namespace}/endpointslices"
                if url.path != expected:
                    self._send_json(404, _status(404, "NotFound", f"the server could not find {url.path}"))
                elif query.get("watch") == ["true"]:
                    self._watch(query)
                else:
                    self._send_json(200, api._list(query))

            def _send_json(self, code: int, body: dict[str, Any]) -> None:
                send_json(self, code, body)

            def _chunk(self, event: dict[str, Any]) -> None:
                line = json.dumps(event).encode() + b"\n"
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                self.wfile.flush()

            def _watch(self, query: dict[str, list[str]]) -> None:
                selector = _selector(query)
                since = int(query.get("resourceVersion", ["0"])[0] or 0)
                timeout_s = float(query.get("timeoutSeconds", ["1800"])[0])
                bookmarks = query.get("allowWatchBookmarks") == ["true"]
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    for event in api._events_after(since, selector, time.monotonic() + timeout_s, bookmarks):
                        self._chunk(event)
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass
                self.close_connection = True

        return Handler

    def _list(self, query: dict[str, list[str]]) -> dict[str, Any]:
        selector = _selector(query)
        with self._lock:
            items = []
            for obj in self._objects.values():
                if _matches(obj, selector):
                    item = json.loads(json.dumps(obj))
                    # List items carry no kind/apiVersion; the list does.
                    item.pop("kind"), item.pop("apiVersion")
                    items.append(item)
            return {
                "kind": "EndpointSliceList",
                "apiVersion": "discovery.k8s.io/v1",
                "metadata": {"resourceVersion": str(self._resource_version)},
                "items": items,
            }

    def _events_after(self, since: int, selector: dict[str, str], deadline: float, bookmarks: bool):
        """Yields watch events newer than ``since`` until ``deadline`` (or 410 and stop)."""
        with self._lock:
            expired_below = self._compacted_below
            position = since or self._resource_version
        if since and since < expired_below:
            message = f"too old resource version: {since} ({expired_below})"
            yield {"type": "ERROR", "object": _status(410, "Expired", message)}
            return
        while True:
            with self._lock:
                pending = [e for e in self._events if e.resource_version > position]
                if not pending:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or self._closing:
                        return
                    self._lock.wait(min(remaining, 0.5))
                    continue
            for event in pending:
                position = event.resource_version
                if _matches(event.obj, selector):
                    yield {"type": event.type, "object": event.obj}
                elif bookmarks:
                    # What the apiserver does for changes the selector hides: move the client's version on.
                    yield {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": "EndpointSlice",
                            "apiVersion": "discovery.k8s.io/v1",
                            "metadata": {"resourceVersion": str(position)},
                        },
                    }


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _selector(query: dict[str, list[str]]) -> dict[str, str]:
    text = query.get("labelSelector", [""])[0]
    return dict(term.split("=", 1) for term in text.split(",") if term)


def _matches(obj: dict[str, Any], selector: dict[str, str]) -> bool:
    labels = obj["metadata"].get("labels", {})
    return all(labels.get(key) == value for key, value in selector.items())
