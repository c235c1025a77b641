"""The FastAPI app every service serves on its HTTP port.

It always has ``/healthz`` (the process is alive), ``/readyz`` (the service can do its job)
and ``/metrics`` (Prometheus). Control routes are mounted behind a bearer token.
"""

from __future__ import annotations

import inspect
import secrets
from collections.abc import Awaitable, Callable, Sequence

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request, status
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr

from relayrl.metrics import ServiceMetrics

ReadinessProbe = Callable[[], "bool | Awaitable[bool]"]

_bearer = HTTPBearer(auto_error=False)


def bearer_auth(token: SecretStr) -> Callable[..., Awaitable[None]]:
    """A dependency that accepts only ``Authorization: Bearer <token>``; an empty token disables it."""
    expected = token.get_secret_value()

    # async: FastAPI runs a plain-def dependency in its thread pool, a thread hop per request (14 %
    # of the rollout's event loop under `bench openai`) for a check that never blocks.
    async def check(credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> None:
        if not expected:
            return
        if credentials is None:
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED,
                "missing bearer token: send 'Authorization: Bearer <RELAYRL_API_TOKEN>'",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not secrets.compare_digest(credentials.credentials.encode(), expected.encode()):
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED, "invalid bearer token", headers={"WWW-Authenticate": "Bearer"}
            )

    return check


# Every service's operator routes live under this one prefix, with the same names:
# POST /control/pause, POST /control/resume, GET /control/status, POST /control/checkpoint.
CONTROL_PREFIX = "/control"


def create_http_app(
    service: str,
    metrics: ServiceMetrics,
    ready: ReadinessProbe,
    api_token: SecretStr,
    control_routers: Sequence[APIRouter] = (),
) -> FastAPI:
    """Builds the service's HTTP app; each router in ``control_routers`` is served under
    :data:`CONTROL_PREFIX` and requires the token."""
    app = FastAPI(title=f"relayrl-{service}", docs_url="/docs", redoc_url=None)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "service": service}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        verdict = ready()
        if inspect.isawaitable(verdict):
            verdict = await verdict
        code = status.HTTP_200_OK if verdict else status.HTTP_503_SERVICE_UNAVAILABLE
        return JSONResponse({"ready": bool(verdict), "service": service}, status_code=code)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    auth = bearer_auth(api_token)
    for router in control_routers:
        app.include_router(router, prefix=CONTROL_PREFIX, dependencies=[Depends(auth)])

    @app.exception_handler(ValueError)
    async def bad_value(_: Request, exc: ValueError) -> JSONResponse:
        # Bad user input anywhere below a route becomes a 400 with the reason, not a 500.
        return JSONResponse({"detail": str(exc)}, status_code=status.HTTP_400_BAD_REQUEST)

    return app
