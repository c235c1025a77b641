"""``relayrl bench paramsync``: how fast one version reaches 1 and N replicas, against raw TCP.

Everything runs as separate processes on this machine, like a real deployment on one node: a
``relayrl paramsync serve`` process, N replica processes (subscribe → fetch with checksum
verification → report, as the rollout service does) and the trainer (this process), all with the
client's defaults (the bulk data plane, xxh3_128 checksums). For each replica count the replicas
start, a first version is published and reaches them all (reported as ``first_version_*``), then
``rounds`` more versions of ``size_mb`` each are published one after the other, as a training run
does; the figures are medians over those rounds:

- ``seconds_by_replicas``: from the trainer's publish call until every replica reported the version;
- ``publish_s_by_replicas``: the trainer's publish call alone (manifest hashing included);
- ``gb_per_s``: bytes / seconds for one replica; ``raw_gb_per_s``: the same bytes through a plain
  loopback TCP socket into another process, measured in the same run; ``ratio_to_raw`` their ratio;
- ``fanout_ratio``: publish_s with the most replicas / publish_s with one (target ≤ 1.2: the trainer
  uploads once whatever the number of replicas).

The first version is kept apart because it pays one-off costs a running job does not: memory
that paramsync and each replica fault in for the first time (afterwards paramsync reuses the
memory of the version it evicts, and each replica that of the version it dropped), connections
and imports. The raw baseline's receiver likewise allocates its buffer before the clock starts.
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from relayrl.net import free_port, wait_for_port

REPO = Path(__file__).resolve().parents[2]
TENSOR_BYTES = 16 * 1024 * 1024


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **extra}


def _payload(size_bytes: int, seed: int) -> dict[str, object]:
    import torch

    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for i, start in enumerate(range(0, size_bytes, TENSOR_BYTES)):
        numel = min(TENSOR_BYTES, size_bytes - start) // 4
        tensors[f"layers.{i}.weight"] = torch.randint(
            -(2**31), 2**31 - 1, (numel,), generator=g, dtype=torch.int32
        ).view(torch.float32)
    return tensors


async def _replica(address: str, replica_id: str, held_version: int) -> None:
    """One bench replica: fetch every announced version, verify it, report, drop it."""
    import torch  # imported up front, as in a running replica, so the first fetch is not charged for it

    from services.paramsync.client import ParamSyncClient

    torch.set_num_threads(1)
    async with ParamSyncClient(address, sync_timeout=600) as client:
        async for announcement in client.subscribe(replica_id, held_version):
            started = time.perf_counter()
            tensors = await client.fetch(announcement.version, replica_id)
            del tensors
            await client.report_version(replica_id, announcement.version, ok=True, sync_s=time.perf_counter() - started)


def _raw_receiver(port: int, size_bytes: int) -> None:
    buffer = bytearray(size_bytes)
    view = memoryview(buffer)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        received = 0
        while received < size_bytes:
            n = sock.recv_into(view[received:])
            if n == 0:
                raise ConnectionError("sender closed early")
            received += n
        sock.sendall(b"k")


def raw_seconds(payload: memoryview) -> float:
    """Seconds to move ``payload`` over loopback TCP into another process (until it has every byte)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        child = subprocess.Popen(
            [sys.executable, "-m", "services.paramsync.bench", "raw", str(port), str(payload.nbytes)],
            env=_env(),
            cwd=REPO,
        )
        try:
            conn, _ = server.accept()
            with conn:
                started = time.perf_counter()
                conn.sendall(payload)
                if conn.recv(1) != b"k":
                    raise ConnectionError("raw receiver did not acknowledge")
                return time.perf_counter() - started
        finally:
            child.wait(60)


async def _until_all_hold(client: object, replica_ids: list[str], version: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        table = {r.replica_id: r.version for r in (await client.list_replicas()).replicas}
        if all(table.get(rid, 0) >= version for rid in replica_ids):
            return
        await asyncio.sleep(0.005)
    raise TimeoutError(f"replicas did not all reach version {version} in {timeout_s:.0f}s")


async def _publish_until_held(trainer: object, tensors: dict, version: int, ids: list[str]) -> tuple[float, float]:
    """(publish seconds, seconds until every replica in ``ids`` holds ``version``)."""
    started = time.perf_counter()
    result = await trainer.publish(version, tensors)
    await _until_all_hold(trainer, ids, version, 600)
    return result.seconds, time.perf_counter() - started


async def _measure(
    address: str, tensors: dict[str, object], counts: list[int], checksum: str, rounds: int
) -> dict[str, dict[str, float]]:
    from services.paramsync.client import ParamSyncClient

    figures: dict[str, dict[str, float]] = {"seconds": {}, "publish_s": {}, "first_seconds": {}, "first_publish_s": {}}
    version = 0
    async with ParamSyncClient(address, checksum_algorithm=checksum, sync_timeout=600) as trainer:
        for count in counts:
            ids = [f"bench-{count}-{i}" for i in range(count)]
            replicas = [
                subprocess.Popen(
                    [sys.executable, "-m", "services.paramsync.bench", "replica", address, rid, str(version)],
                    env=_env(),
                    cwd=REPO,
                )
                for rid in ids
            ]
            try:
                # Every replica is subscribed (and so in the table) before the clock starts.
                while not set(ids) <= {r.replica_id for r in (await trainer.list_replicas()).replicas}:
                    await asyncio.sleep(0.05)
                version += 1
                first = await _publish_until_held(trainer, tensors, version, ids)
                measured = []
                for _ in range(rounds):
                    version += 1
                    measured.append(await _publish_until_held(trainer, tensors, version, ids))
            finally:
                for proc in replicas:
                    proc.kill()
                    proc.wait()
            key = str(count)
            figures["first_publish_s"][key], figures["first_seconds"][key] = first
            figures["publish_s"][key] = statistics.median(p for p, _ in measured)
            figures["seconds"][key] = statistics.median(h for _, h in measured)
    return figures


def run_bench(
    size_mb: int, replica_counts: list[int], checksum: str = "xxh3_128", rounds: int = 5
) -> dict[str, object]:
    import torch

    from services.paramsync.tensors import as_pairs, raw_bytes

    torch.set_num_threads(1)
    size_bytes = size_mb * 1024 * 1024
    tensors = _payload(size_bytes, seed=0)
    # The same bytes, back to back, for the raw baseline (one extra copy, freed right after).
    flat = b"".join(bytes(raw_bytes(t)) for _, t in as_pairs(tensors))
    raw_s = raw_seconds(memoryview(flat))
    del flat

    grpc_port, http_port = free_port(), free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "services.paramsync.cli", "serve"],
        env=_env(
            RELAYRL_PARAMSYNC_GRPC_PORT=str(grpc_port),
            RELAYRL_PARAMSYNC_HTTP_PORT=str(http_port),
            RELAYRL_PARAMSYNC_KEEP_VERSIONS="1",
            RELAYRL_PARAMSYNC_LOG_LEVEL="WARNING",
        ),
        cwd=REPO,
    )
    try:
        wait_for_port("127.0.0.1", grpc_port, 60)
        measured = asyncio.run(_measure(f"127.0.0.1:{grpc_port}", tensors, replica_counts, checksum, rounds))
    finally:
        server.terminate()
        server.wait(30)

    seconds, publish_s = measured["seconds"], measured["publish_s"]
    rounded = {name: {k: round(v, 4) for k, v in values.items()} for name, values in measured.items()}
    one, most = str(min(replica_counts)), str(max(replica_counts))
    gb = size_bytes / 1e9
    gb_per_s = gb / seconds[one]
    raw_gb_per_s = gb / raw_s
    return {
        "benchmark": "paramsync",
        "size_mb": size_mb,
        "checksum_algorithm": checksum,
        "rounds": rounds,
        "seconds_by_replicas": rounded["seconds"],
        "publish_s_by_replicas": rounded["publish_s"],
        "first_version_seconds_by_replicas": rounded["first_seconds"],
        "first_version_publish_s_by_replicas": rounded["first_publish_s"],
        "gb_per_s": round(gb_per_s, 4),
        "raw_gb_per_s": round(raw_gb_per_s, 4),
        "ratio_to_raw": round(gb_per_s / raw_gb_per_s, 4),
        "fanout_ratio": round(publish_s[most] / publish_s[one], 4),
        "delivery_fanout_ratio": round(seconds[most] / seconds[one], 4),
        "cpu_count": os.cpu_count(),
    }


if __name__ == "__main__":
    if sys.argv[1] == "replica":
        asyncio.run(_replica(sys.argv[2], sys.argv[3], int(sys.argv[4])))
    elif sys.argv[1] == "raw":
        _raw_receiver(int(sys.argv[2]), int(sys.argv[3]))
    else:
        raise SystemExit(f"unknown bench role {sys.argv[1]!r}")
