"""The engine process: load the model, start the scheduler thread, serve HTTP until SIGTERM."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from relayrl.http_app import create_http_app
from relayrl.serving import Servers, serve_until_signal, start_servers
from services.engine.api import sglang_router
from services.engine.config import EngineSettings
from services.engine.state import EngineState

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 10.0


async def serve(settings: EngineSettings) -> None:
    await serve_until_signal("engine", lambda: start_engine(settings))


async def start_engine(settings: EngineSettings) -> RunningEngine:
    state = EngineState(settings)
    state.scheduler.start()
    app = create_http_app("engine", state.metrics.registry, lambda: True, settings.api_token)
    # SGLang's routes carry no auth (as an SGLang server started without --api-key): the engine
    # sits next to its rollout replica on a private network.
    app.include_router(sglang_router(state))
    servers = await start_servers(settings, app)
    log.info("engine serving %s on http://%s:%d", settings.model_path, settings.host, servers.http.port)
    return RunningEngine(servers, state)


@dataclass
class RunningEngine:
    servers: Servers
    state: EngineState

    async def stop(self) -> None:
        # Requests end first (with an abort the client can resubmit elsewhere), so the HTTP
        # server's drain never waits on a generation that a pause holds. Bounded: a scheduler
        # thread that no longer answers must not keep the engine from stopping.
        try:
            await asyncio.wait_for(self.state.scheduler.call(self.state.scheduler.close), CLOSE_TIMEOUT_S)
        except TimeoutError:
            log.warning("the scheduler did not end its requests within %.0fs; stopping anyway", CLOSE_TIMEOUT_S)
        await self.servers.stop()
        self.state.scheduler.stop()
