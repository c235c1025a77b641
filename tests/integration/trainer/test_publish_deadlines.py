"""The trainer's publish against a paramsync that stops answering mid-upload (SIGSTOP): the
training thread gets its buckets off its hands within the deadline instead of hanging, the
failure is recorded naming the stage, the peer and the version, and the previous version stays
the latest."""

from __future__ import annotations

import signal
import time

import torch
from prometheus_client.parser import text_string_to_metric_families

from relayrl import http_client
from relayrl.net import free_port
from services.paramsync.client import ParamSyncClient
from services.paramsync.table import lag_deadline_s
from services.paramsync.tensors import as_pairs, open_specs
from services.trainer.links import IoThread, Publisher
from tests.integration.paramsync.harness import serve_process
from tests.waiting import wait_until

MiB = 1024 * 1024
SYNC_TIMEOUT_S = 2.0


def version(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # The middle bucket is larger than the socket buffers, so sending it blocks on a stopped peer.
    return {
        "embed": torch.randn(MiB // 4, generator=g),
        "big": torch.randn(32 * MiB // 4, generator=g),
        "norm": torch.randn(64, generator=g),
    }


def received_bytes(http_port: int) -> float:
    text = http_client.get(f"http://127.0.0.1:{http_port}/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "relayrl_paramsync_bytes_received_bytes_total":
                return sample.value
    return 0.0


def test_a_publish_to_a_stopped_paramsync_fails_in_time_and_keeps_the_previous_version(tmp_path):
    data_port = free_port()
    env = {"RELAYRL_PARAMSYNC_DATA_PORT": str(data_port), "RELAYRL_PARAMSYNC_UPLOAD_RESUME_WINDOW_S": "1"}
    with serve_process(tmp_path, **env) as (address, http_port, proc):
        io = IoThread()

        async def open_sink() -> ParamSyncClient:
            return ParamSyncClient(address, sync_timeout=SYNC_TIMEOUT_S, max_sync_retries=0)

        sink = io.call(open_sink())
        # As the trainer sets it up: the hand-off may wait as long as the upload's attempts.
        publisher = Publisher(io, sink, lag_deadline_s(SYNC_TIMEOUT_S, 0, 1.0))
        try:
            first = version(seed=1)
            handoff = publisher.begin_streamed(1, open_specs(as_pairs(first)), trainer_step=1)
            handoff.put([first["embed"]])
            handoff.put([first["big"]])
            handoff.put([first["norm"]])
            handoff.end()
            publisher.drain(60)
            assert publisher.records[-1].ok, publisher.records[-1]

            second = version(seed=2)
            handoff = publisher.begin_streamed(2, open_specs(as_pairs(second)), trainer_step=2)
            started = time.monotonic()
            handoff.put([second["embed"]])
            wait_until(
                lambda: received_bytes(http_port) >= sum(t.numel() * 4 for t in first.values()) + MiB,
                what="the first bucket of version 2 at paramsync",
            )
            proc.send_signal(signal.SIGSTOP)  # paramsync hangs with its sockets open
            try:
                handoff.put([second["big"]])
                handoff.put([second["norm"]])  # taken only once "big" is sent: never, here
                handoff.end()
                training_waited = time.monotonic() - started
                publisher.drain(60)
            finally:
                proc.send_signal(signal.SIGCONT)
            record = publisher.records[-1]
            assert training_waited < 3 * SYNC_TIMEOUT_S  # the deadline, not a hang
            assert record.version == 2 and not record.ok
            assert "upload of version 2" in record.error and f"127.0.0.1:{data_port}" in record.error, record.error
            assert publisher.latest_version() == 1
        finally:
            io.call(sink.close())
            io.stop()
