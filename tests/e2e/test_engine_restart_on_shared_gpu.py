"""An engine whose share of a GPU the stack chose (a memory fraction, counting what the trainer and
the engines before it hold) restarts after a crash with the KV cache it sized at its first start
(``max_total_tokens``): by then everything beside it holds its memory, and the fraction alone would
leave it no room, so it would fail at every restart until the stack gave up.

The stack is planned for one GPU shared by the trainer and two engines; the engines themselves
compute on the CPU (their section's device), which is what lets this run without a GPU."""

from __future__ import annotations

from commands.stack.process import http_ready
from relayrl import http_client
from tests.e2e.conftest import running_stack, small_run
from tests.waiting import wait_until


def _kv_tokens(url: str) -> int:
    info = http_client.get(f"{url}/get_model_info", timeout=10).json()
    return info["kv_total_blocks"] * info["kv_block_size"]


def test_an_engine_restarts_with_the_kv_cache_it_had(runs_dir, tiny_model_dir):
    config = small_run(runs_dir, tiny_model_dir, max_staleness=1, total_steps=1)
    config.stack.device, config.stack.gpus, config.stack.rollout_replicas = "cuda", [0], 2
    config.stack.restart_backoff_s = 0.2
    config.engine = {"device": "cpu"}
    with running_stack(config, training=False) as stack:
        assert stack.gpus is not None and stack.gpus.engine_mem_fraction == (0.25, 0.5)
        sized = [_kv_tokens(url) for url in stack.endpoints.engines]
        engines = [stack.supervisor.get(f"engine-{i}") for i in range(2)]
        assert [e.spec.env["RELAYRL_ENGINE_MAX_TOTAL_TOKENS"] for e in engines] == [str(t) for t in sized]

        engines[0].kill()
        healthy = http_ready(f"{stack.endpoints.engines[0]}/health")

        def back() -> bool:
            stack.supervisor.check_alive()
            return engines[0].running() and healthy()

        wait_until(back, 120, "engine-0 to be restarted and healthy", poll_s=0.2)
        assert stack.supervisor.restarts["engine-0"].restarts == 1
        assert _kv_tokens(stack.endpoints.engines[0]) == sized[0]
