"""The engine process: load the model, start the scheduler thread, serve HTTP until SIGTERM."""

from __future__ import annotations

import logging

from relayrl.http_app import create_http_app
from relayrl.serving import start_http_server, wait_for_shutdown_signal
from services.engine.api import sglang_router
from services.engine.config import EngineSettings
from services.engine.state import EngineState

log = logging.getLogger(__name__)


async def serve(settings: EngineSettings) -> None:
    state = EngineState(settings)
    state.scheduler.start()
    app = create_http_app("engine", state.metrics.registry, lambda: True, settings.api_token)
    # SGLang's routes carry no auth (as an SGLang server started without --api-key): the engine
    # sits next to its rollout replica on a private network.
    app.include_router(sglang_router(state))
    http = await start_http_server(app, settings.host, settings.http_port)
    log.info("engine serving %s on http://%s:%d", settings.model_path, settings.host, http.port)
    try:
        await wait_for_shutdown_signal()
    finally:
        await http.stop()
        state.scheduler.stop()
