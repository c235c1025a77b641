"""One fuzzing run: start the services, fuzz each one's gRPC and REST interfaces, check that
none died and nothing accepted was lost, and return the figures as one JSON-able dict."""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from commands.fuzz import grpc_targets as G
from commands.fuzz.grpc_fuzz import fuzz_methods
from commands.fuzz.report import Tally
from commands.fuzz.rest_fuzz import fuzz_rest
from commands.fuzz.targets import ALL_SERVICES, Targets, start_targets
from commands.stack.supervisor import supervised

GRPC = {"queue": G.queue_methods, "paramsync": G.paramsync_methods, "rollout": G.rollout_methods}
CHECKS = {"queue": (G.queue_before, G.queue_after), "paramsync": (G.paramsync_before, G.paramsync_after)}


def rest_examples(calls: int) -> int:
    """Generated requests per REST operation and mode: REST APIs are small, so fewer suffice."""
    return max(5, min(calls // 100, 100))


async def _fuzz_grpc(name: str, address: str, calls: int, seed: int, tally: Tally) -> None:
    before_check, after_check = CHECKS.get(name, (None, None))
    before = await before_check(address) if before_check else None
    await fuzz_methods(address, GRPC[name](), calls, seed, tally)
    if after_check:
        await after_check(address, before, tally)


def fuzz(
    calls: int, services: tuple[str, ...] = ALL_SERVICES, seed: int = 0, work: Path | None = None
) -> dict[str, Any]:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="relayrl-fuzz-") as tmp, supervised(sink=None) as supervisor:
        targets: Targets = start_targets(supervisor, work or Path(tmp), services)
        grpc_tallies: dict[str, Tally] = {}
        rest_tallies: dict[str, Tally] = {}
        for name in services:
            target = targets.by_name[name]
            if name in GRPC:
                tally = grpc_tallies[name] = Tally()
                asyncio.run(_fuzz_grpc(name, target.grpc, calls, seed, tally))
                if not target.process.running():
                    tally.fail("crashes", f"{name} exited with code {target.process.process.returncode}")
            tally = rest_tallies[name] = Tally()
            fuzz_rest(target.http, targets.api_token, rest_examples(calls), seed, tally)
            if not target.process.running():
                tally.fail("crashes", f"{name} exited with code {target.process.process.returncode}")
        every = [*grpc_tallies.values(), *rest_tallies.values()]
        return {
            "seed": seed,
            "calls_requested_per_grpc_service": calls,
            "grpc": {k: v.as_json() for k, v in grpc_tallies.items()},
            "rest": {k: v.as_json() for k, v in rest_tallies.items()},
            "crashes": sum(t.crashes for t in every),
            "hangs": sum(t.hangs for t in every),
            "unexplained_errors": sum(t.unexplained for t in every),
            "lost": sum(t.lost for t in every),
            "ok": all(t.ok for t in every),
            "wall_s": round(time.monotonic() - started, 1),
        }
