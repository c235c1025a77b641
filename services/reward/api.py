"""``POST /score``: validation, the batcher, and answers with a status a client can act on.

400 (a token outside the vocabulary) and 422 (a malformed item) name the item and its field;
413 refuses more items than ``max_items_per_request`` or a sequence over ``max_length``; 503
says the model is not loaded yet; 500 is a forward pass that failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fastapi import APIRouter, FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from services.reward.batcher import DynamicBatcher
from services.reward.config import RewardSettings
from services.reward.judge import Verdict
from services.reward.metrics import RewardMetrics
from services.reward.schemas import ScoreRequest, ScoreResponse
from services.reward.scoring import Scorer, TooLong


def _where(loc: tuple[int | str, ...]) -> str:
    """``("body", "items", 3, "input_ids", 0)`` → ``items[3].input_ids[0]``."""
    text = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "body"


def validation_message(exc: RequestValidationError) -> str:
    return "; ".join(f"{_where(tuple(err['loc']))}: {err['msg']}" for err in exc.errors())


def install_error_handlers(app: FastAPI, metrics: RewardMetrics) -> None:
    @app.exception_handler(RequestValidationError)
    async def malformed(request: Request, exc: RequestValidationError) -> JSONResponse:
        if request.url.path == "/score":
            metrics.requests.labels(code="422").inc()
            metrics.errors.labels(kind="bad_request").inc()
        return JSONResponse(
            {
                "detail": validation_message(exc),
                "errors": [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()],
            },
            status_code=status.HTTP_422_UNPROCESSABLE_CONTENT,
        )


def _answer(metrics: RewardMetrics, code: int, detail: str, kind: str) -> JSONResponse:
    metrics.requests.labels(code=str(code)).inc()
    metrics.errors.labels(kind=kind).inc()
    return JSONResponse({"detail": detail}, status_code=code)


def score_router(
    settings: RewardSettings,
    scorer: Callable[[], Scorer | None],
    batcher: DynamicBatcher[Verdict],
    metrics: RewardMetrics,
) -> APIRouter:
    router = APIRouter()

    @router.post("/score", response_model=ScoreResponse)
    async def score(body: ScoreRequest) -> Response:
        started = time.perf_counter()
        model = scorer()
        if model is None:
            return _answer(metrics, status.HTTP_503_SERVICE_UNAVAILABLE, "the reward model is still loading", "loading")
        if len(body.items) > settings.max_items_per_request:
            return _answer(
                metrics,
                status.HTTP_413_CONTENT_TOO_LARGE,
                f"items: {len(body.items)} items, more than max_items_per_request {settings.max_items_per_request}",
                "bad_request",
            )
        try:
            encoded = [model.encode(item, i).ids for i, item in enumerate(body.items)]
        except TooLong as exc:
            return _answer(metrics, status.HTTP_413_CONTENT_TOO_LARGE, str(exc), "bad_request")
        except ValueError as exc:
            return _answer(metrics, status.HTTP_400_BAD_REQUEST, str(exc), "bad_request")
        try:
            verdicts = await batcher.submit(encoded)
        except Exception as exc:
            return _answer(metrics, status.HTTP_500_INTERNAL_SERVER_ERROR, f"scoring failed: {exc}", "model")
        metrics.items_scored.inc(len(verdicts))
        unparsed = sum(not v.parsed for v in verdicts)
        if unparsed:
            metrics.unparsed_verdicts.inc(unparsed)
        metrics.requests.labels(code="200").inc()
        metrics.request_latency.observe(time.perf_counter() - started)
        answer = ScoreResponse.model_construct(
            scores=[v.score for v in verdicts],
            parsed=[v.parsed for v in verdicts] if settings.kind == "judge" else None,
            model=settings.model_path,
        )
        # Serialised here, once: handing FastAPI the model would validate it again against
        # response_model and encode it field by field: per-request work that batching cannot share out.
        return Response(answer.model_dump_json(), media_type="application/json")

    return router
