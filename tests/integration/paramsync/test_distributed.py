"""The distributed transport: weights go from a trainer process, through paramsync, into the built-in
engine over a gloo process group, and the engine's greedy outputs become those of the new weights."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from relayrl.models.loading import load_causal_lm
from relayrl.net import free_port
from services.engine.client import EngineClient, SamplingParams
from services.engine.launch import launch_engine, wait_engine_healthy
from services.paramsync.client import ParamSyncClient
from tests.integration.paramsync.harness import REPO, python_env, serve_process, stop

HERE = Path(__file__).parent
PROMPT = [5, 17, 42, 99, 7]
NEW_TOKENS = 6


def reference_logprobs(model_dir: Path, output_ids: list[int]) -> list[float]:
    """Log-probs the model in ``model_dir`` gives ``output_ids`` after PROMPT, computed with transformers."""
    model = load_causal_lm(model_dir)
    ids = torch.tensor([PROMPT + output_ids])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    return [float(logprobs[len(PROMPT) - 1 + i, tok]) for i, tok in enumerate(output_ids)]


async def engine_greedy(url: str) -> tuple[list[int], list[float]]:
    async with EngineClient(url, timeout=60) as engine:
        params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
        out = (await engine.generate(PROMPT, params))[0]
        return out.output_ids, out.logprobs


def test_distributed_transport_moves_trainer_weights_into_the_engine_over_gloo(tiny_model_dir, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    engine = launch_engine(tiny_model_dir, port, stderr=(tmp_path / "engine.log").open("wb"), cwd=REPO)
    try:
        wait_engine_healthy(engine, url, timeout_s=60)
        before = asyncio.run(engine_greedy(url))
        env = {
            "RELAYRL_PARAMSYNC_TRANSPORT": "distributed",
            # ghost's engine never answers: it must end up lagging without holding engine-0 back.
            "RELAYRL_PARAMSYNC_STATIC_REPLICAS": f"engine-0={url},ghost=http://127.0.0.1:{free_port()}",
            "RELAYRL_PARAMSYNC_MAX_SYNC_RETRIES": "1",
            "RELAYRL_PARAMSYNC_SYNC_RETRY_DELAY": "0.1",
            "RELAYRL_PARAMSYNC_DIST_BUCKET_BYTES": str(256 * 1024),  # several buckets for a tiny model
            "RELAYRL_PARAMSYNC_SYNC_TIMEOUT": "60",
        }
        with serve_process(tmp_path, **env) as (address, _, _):
            new_model = tmp_path / "trainer-model"
            trainer = subprocess.run(
                [sys.executable, str(HERE / "trainer_proc.py"), address, "1", str(new_model), "1234"],
                env=python_env(),
                cwd=REPO,
                capture_output=True,
                timeout=120,
            )
            assert trainer.returncode == 0, trainer.stderr.decode()[-2000:]
            assert trainer.stdout.startswith(b"PUBLISHED 1")

            async def wait_synced() -> object:
                async with ParamSyncClient(address) as ps:
                    deadline = time.monotonic() + 60
                    while time.monotonic() < deadline:
                        rows = {r.replica_id: r for r in (await ps.list_replicas()).replicas}
                        if rows["engine-0"].version == 1 and rows["ghost"].state == "lagging":
                            return rows
                        await asyncio.sleep(0.1)
                raise AssertionError(f"engine-0 never reached version 1 with ghost lagging: {rows}")

            rows = asyncio.run(wait_synced())
            assert rows["engine-0"].state == "in_sync" and rows["ghost"].version == 0
            assert "health" in rows["ghost"].last_error or "not delivered" in rows["ghost"].last_error

        async def engine_version() -> str:
            async with EngineClient(url) as client:
                return await client.weight_version()

        assert asyncio.run(engine_version()) == "1"
        after_ids, after_logprobs = asyncio.run(engine_greedy(url))
        expected = reference_logprobs(new_model, after_ids)
        assert after_logprobs == pytest.approx(expected, abs=1e-4)
        before_ids, before_logprobs = before
        assert (after_ids, after_logprobs) != (before_ids, before_logprobs)
        assert after_logprobs != pytest.approx(reference_logprobs(tiny_model_dir, after_ids), abs=1e-3)
    finally:
        stop(engine)
