"""One call to one component, turned into a value or a :class:`CallError` that names the
endpoint and the cause in words (never a traceback)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypedDict, TypeVar

import grpc
import httpx
from pydantic import SecretStr

from relayrl import http_client
from relayrl.http_app import CONTROL_PREFIX
from relayrl.serving import GRPC_CHANNEL_OPTIONS

T = TypeVar("T")


class CallError(Exception):
    """A failed call: ``endpoint`` is what was called, ``cause`` says why in plain words."""

    def __init__(self, endpoint: str, cause: str) -> None:
        super().__init__(f"{endpoint}: {cause}")
        self.endpoint = endpoint
        self.cause = cause


_TOKEN_HINT = "set RELAYRL_API_TOKEN to the deployment's API token"


class HttpControl:
    """Calls with the bearer token to one service's control routes (under ``CONTROL_PREFIX``)."""

    def __init__(self, base_url: str, token: SecretStr, timeout_s: float) -> None:
        self.base_url = base_url
        self._token = token.get_secret_value()
        self._timeout_s = timeout_s

    def call(self, method: str, route: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """``method`` on the control route ``route`` (``"status"`` is ``/control/status``)."""
        path = f"{CONTROL_PREFIX}/{route}"
        endpoint = f"{method} {self.base_url}{path}"
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        try:
            with http_client.client(base_url=self.base_url, timeout=self._timeout_s) as client:
                response = client.request(method, path, json=body, headers=headers)
        except httpx.ConnectError as exc:
            raise CallError(endpoint, f"unreachable ({_reason(exc)}); is the service running there?") from None
        except httpx.TimeoutException:
            raise CallError(endpoint, f"no answer within {self._timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            raise CallError(endpoint, f"request failed: {_reason(exc)}") from None
        if response.status_code == httpx.codes.UNAUTHORIZED:
            cause = "missing API token" if not self._token else "the API token was refused"
            raise CallError(endpoint, f"401 Unauthorized: {cause} ({_detail(response)}); {_TOKEN_HINT}")
        if response.status_code == httpx.codes.FORBIDDEN:
            raise CallError(endpoint, f"403 Forbidden: {_detail(response)}")
        if response.status_code == httpx.codes.NOT_FOUND:
            raise CallError(endpoint, "404 Not Found: no such route; is this the right service's HTTP port?")
        if response.is_error:
            raise CallError(endpoint, f"{response.status_code} {response.reason_phrase}: {_detail(response)}")
        try:
            payload = response.json()
        except ValueError:
            raise CallError(endpoint, "the answer is not JSON; is this a RelayRL service?") from None
        if not isinstance(payload, dict):
            raise CallError(endpoint, "the answer is not a JSON object; is this a RelayRL service?")
        return payload


class CallOptions(TypedDict):
    """What :func:`grpc_call` passes to the stub method ``invoke`` calls (``**options``)."""

    timeout: float
    wait_for_ready: bool


def grpc_call(address: str, method: str, invoke: Callable[[grpc.Channel, CallOptions], T], timeout_s: float) -> T:
    """Runs ``invoke`` on a fresh channel to ``address``, mapping gRPC failures to :class:`CallError`.

    If nothing listens there, the call is made once more, waiting up to ``timeout_s`` in all for the
    service to come up: one that is restarting (a rollout, a chaos fault) is reached, and one that
    stays down is named unreachable with the cause. The wait is the call's own ``wait_for_ready``,
    not gRPC's readiness future: that future polls the channel from a thread, closing the channel
    waits for the poll, and a Ctrl-C landing in that wait left the channel half closed, so that its
    finaliser later blocked the interpreter for good (``relayrl up`` hung after Ctrl-C).
    """
    endpoint = f"gRPC {address} {method}"
    with grpc.insecure_channel(address, options=GRPC_CHANNEL_OPTIONS) as channel:
        try:
            return _invoke_waiting(channel, invoke, timeout_s, endpoint)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            details = _details(exc)
            if code == grpc.StatusCode.UNAVAILABLE:
                raise CallError(endpoint, f"unavailable ({details})") from None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise CallError(endpoint, f"no answer within {timeout_s:g} s") from None
            if code == grpc.StatusCode.UNIMPLEMENTED:
                raise CallError(endpoint, "not served there; is this the right service's gRPC port?") from None
            if code == grpc.StatusCode.UNAUTHENTICATED:
                raise CallError(endpoint, f"unauthenticated ({details}); {_TOKEN_HINT}") from None
            raise CallError(endpoint, f"{code.name if code else 'error'}: {details}") from None


def _invoke_waiting(
    channel: grpc.Channel, invoke: Callable[[grpc.Channel, CallOptions], T], timeout_s: float, endpoint: str
) -> T:
    """``invoke`` at once; if nothing listens yet, once more, waiting for the service within
    ``timeout_s`` in all (:class:`CallError` naming the refusal if it never comes up)."""
    started = time.monotonic()
    try:
        return invoke(channel, CallOptions(timeout=timeout_s, wait_for_ready=False))
    except grpc.RpcError as exc:
        if not _refused(exc):
            raise
        refused = _details(exc) or ""
    left_s = timeout_s - (time.monotonic() - started)
    try:
        return invoke(channel, CallOptions(timeout=max(left_s, 0.001), wait_for_ready=True))
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
            raise
    raise CallError(
        endpoint,
        f"unreachable ({_cause(refused)}, and no connection within {timeout_s:g} s); is the service running there?",
    )


def _details(exc: grpc.RpcError) -> str | None:
    return exc.details() if hasattr(exc, "details") else str(exc)


def _refused(exc: grpc.RpcError) -> bool:
    """No connection could be made: nothing listens at the address (yet)."""
    code = exc.code() if hasattr(exc, "code") else None
    return code == grpc.StatusCode.UNAVAILABLE and "failed to connect" in (_details(exc) or "").lower()


def _reason(exc: Exception) -> str:
    return _cause(str(exc)) or type(exc).__name__


def _cause(text: str) -> str:
    """An error's text in plain words: a refused connection says so, anything else as it came."""
    text = text.strip()
    if "Connection refused" in text or "Errno 111" in text:
        return "connection refused"
    return text


def _detail(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    return str(detail) if detail else (response.text.strip()[:200] or "no details")
