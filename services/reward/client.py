"""An async client of the reward service's ``POST /score``, for the rollout and the benchmark.

One call is one HTTP request and nothing more: how long to keep trying belongs to the caller,
who retries :func:`relayrl.retry.http_transient` failures (``/score`` is a pure function of its
body, so a request sent twice scores twice the same). A refusal raises
``httpx.HTTPStatusError`` whose message carries the service's ``detail``.
"""

from __future__ import annotations

from typing import Any

import httpx

from relayrl import http_client


class RewardClient:
    def __init__(self, base_url: str, timeout_s: float) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = http_client.async_client(base_url=self.base_url, timeout=timeout_s)

    async def score(self, items: list[dict[str, Any]]) -> list[float]:
        """One score per item (see services/reward/schemas.py for the item forms), in order."""
        response = await self._http.post("/score", json={"items": items})
        if response.is_error:
            detail = _detail(response)
            raise httpx.HTTPStatusError(
                f"reward service answered {response.status_code}: {detail}", request=response.request, response=response
            )
        scores = response.json()["scores"]
        if len(scores) != len(items):
            raise ValueError(f"reward service returned {len(scores)} scores for {len(items)} items")
        return [float(s) for s in scores]

    async def ready(self) -> bool:
        """True when the service answers /readyz with 200 (its model is loaded)."""
        try:
            return (await self._http.get("/readyz")).status_code == 200
        except httpx.HTTPError:
            return False

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> RewardClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail", response.text))
    except ValueError:
        return response.text[:500]
