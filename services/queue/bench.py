"""``relayrl bench queue``: trajectory throughput through the service against raw Redis, one run.

Both paths move the same serialized groups (``samples`` × ``response_tokens`` tokens with ids,
log-probs and versions) through one private redis-server on loopback, with ``producers``
concurrent producers and one consumer, ``batch`` groups per call:

- service: ``relayrl queue serve`` as its own process; producers Push over gRPC (the
  service validates every group), the consumer Pulls (staleness check) and Acks over gRPC.
- raw: the same redis-py client doing ``XADD`` / ``XREADGROUP`` / ``XACK`` directly.

Both paths do the same work at the ends: producers send bytes serialized before the clock
starts, and the consumer decodes every group it receives into a ``TrajectoryGroup`` (what
a trainer must do either way); dataclass conversion is left out of both.

Latency is per group, from the start of its push to the end of its ack.

The two paths run in alternating rounds (raw, service, raw, service, ...) against the same
redis-server and service process, and the figures are medians over the rounds: a single raw
run of a few hundred groups lasts about 0.1 s, so one burst of load elsewhere on the machine
swung the ratio anywhere between 0.19 and 0.65.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import redis.asyncio as aioredis

from relayrl import http_client
from relayrl.net import free_port
from relayrl.redis_process import RedisProcess
from relayrl.serving import grpc_channel
from relayrl.v1 import queue_pb2 as qpb
from relayrl.v1 import queue_pb2_grpc as qgrpc
from relayrl.v1 import trajectory_pb2 as pb


@dataclass(frozen=True, slots=True)
class BenchSpec:
    groups: int = 400
    producers: int = 4
    batch: int = 8
    samples: int = 8
    response_tokens: int = 1024
    prompt_tokens: int = 256
    rounds: int = 3


@dataclass(frozen=True, slots=True)
class PathResult:
    seconds: float
    latencies_s: list[float]


def realistic_group(spec: BenchSpec, rng: random.Random, index: int) -> pb.TrajectoryGroup:
    prompt = [rng.randrange(32_000) for _ in range(spec.prompt_tokens)]
    trajectories = [
        pb.Trajectory(
            prompt_token_ids=prompt,
            response_token_ids=[rng.randrange(32_000) for _ in range(spec.response_tokens)],
            behavior_logprobs=[-rng.random() * 5 for _ in range(spec.response_tokens)],
            policy_versions=[3] * spec.response_tokens,
            reward=rng.random(),
            finish_reason=pb.FINISH_REASON_STOP,
            replica_id="bench",
        )
        for _ in range(spec.samples)
    ]
    return pb.TrajectoryGroup(
        group_id=f"bench-{index}",
        prompt_id=f"bench/{index}",
        trajectories=trajectories,
        min_policy_version=3,
        max_policy_version=3,
        created_at_unix_s=time.time(),
    )


def _split(items: list, parts: int) -> list[list]:
    return [items[i::parts] for i in range(parts)]


async def _service_path(address: str, groups: list[pb.TrajectoryGroup], spec: BenchSpec) -> PathResult:
    pushed_at: dict[str, float] = {}
    latencies: list[float] = []
    chunks = [
        ([g.group_id for g in chunk], qpb.PushRequest(groups=chunk, timeout_s=60).SerializeToString())
        for mine in _split(groups, spec.producers)
        for chunk in (mine[i : i + spec.batch] for i in range(0, len(mine), spec.batch))
    ]
    channels = [grpc_channel(address) for _ in range(spec.producers + 1)]
    try:

        async def produce(channel: grpc.aio.Channel, mine: list[tuple[list[str], bytes]]) -> None:
            push = channel.unary_unary("/relayrl.v1.TrajectoryQueue/Push", request_serializer=bytes)
            for ids, request in mine:
                now = time.perf_counter()
                for gid in ids:
                    pushed_at[gid] = now
                await push(request)

        async def consume(stub: qgrpc.TrajectoryQueueStub) -> None:
            while len(latencies) < len(groups):
                reply = await stub.Pull(
                    qpb.PullRequest(
                        consumer="bench", current_version=3, max_staleness=0, max_groups=spec.batch, block_timeout_s=1
                    )
                )
                await stub.Ack(qpb.AckRequest(consumer="bench", entry_ids=[d.entry_id for d in reply.groups]))
                done = time.perf_counter()
                latencies.extend(done - pushed_at[d.group.group_id] for d in reply.groups)

        started = time.perf_counter()
        await asyncio.gather(
            consume(qgrpc.TrajectoryQueueStub(channels[-1])),
            *(produce(channel, mine) for channel, mine in zip(channels, _split(chunks, spec.producers), strict=False)),
        )
        return PathResult(time.perf_counter() - started, latencies)
    finally:
        for c in channels:
            await c.close()


async def _raw_path(url: str, groups: list[pb.TrajectoryGroup], spec: BenchSpec, stream: str) -> PathResult:
    group_name = "bench"
    payloads = [(g.group_id, g.SerializeToString()) for g in groups]
    client = aioredis.Redis.from_url(url)
    pushed_at: dict[bytes, float] = {}
    latencies: list[float] = []
    try:
        await client.xgroup_create(stream, group_name, id="0", mkstream=True)

        async def produce(mine: list[tuple[str, bytes]]) -> None:
            for i in range(0, len(mine), spec.batch):
                pipe = client.pipeline(transaction=False)
                now = time.perf_counter()
                for gid, payload in mine[i : i + spec.batch]:
                    pushed_at[gid.encode()] = now
                    pipe.xadd(stream, {"v_min": 3, "gid": gid, "payload": payload})
                await pipe.execute()

        async def consume() -> None:
            while len(latencies) < len(payloads):
                reply = await client.xreadgroup(group_name, "bench", {stream: ">"}, count=spec.batch, block=1000)
                entries = reply[0][1] if reply else []
                decoded = [pb.TrajectoryGroup.FromString(fields[b"payload"]) for _, fields in entries]
                if entries:
                    await client.xack(stream, group_name, *[e[0] for e in entries])
                done = time.perf_counter()
                latencies.extend(done - pushed_at[g.group_id.encode()] for g in decoded)

        started = time.perf_counter()
        await asyncio.gather(consume(), *(produce(mine) for mine in _split(payloads, spec.producers)))
        result = PathResult(time.perf_counter() - started, latencies)
        await client.delete(stream)  # after the clock: the service path finds Redis as empty as raw did
        return result
    finally:
        await client.aclose()


async def _start_service(redis_url: str) -> tuple[subprocess.Popen[bytes], str]:
    grpc_port, http_port = free_port(), free_port()
    env = {
        **os.environ,
        "RELAYRL_REDIS_URL": redis_url,
        "RELAYRL_RUN_ID": "bench",
        "RELAYRL_QUEUE_GRPC_PORT": str(grpc_port),
        "RELAYRL_QUEUE_HTTP_PORT": str(http_port),
        "RELAYRL_QUEUE_LOG_LEVEL": "WARNING",
    }
    proc = subprocess.Popen([sys.executable, "-m", "services.queue.cli", "serve"], env=env)
    deadline = time.monotonic() + 30
    async with http_client.async_client() as http:
        while True:
            try:
                if (await http.get(f"http://127.0.0.1:{http_port}/readyz")).status_code == 200:
                    return proc, f"127.0.0.1:{grpc_port}"
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("queue service did not become ready")
            await asyncio.sleep(0.1)


def _percentile_ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_bench(spec: BenchSpec) -> dict[str, float | int | str]:
    rng = random.Random(0)
    groups = [realistic_group(spec, rng, i) for i in range(spec.groups)]
    mb = sum(g.ByteSize() for g in groups) / 1e6
    with tempfile.TemporaryDirectory(prefix="relayrl-bench-queue-") as tmp:
        redis = RedisProcess(data_dir=Path(tmp)).start()
        proc = None
        raw_rounds: list[PathResult] = []
        service_rounds: list[PathResult] = []
        try:
            proc, address = await _start_service(redis.url)
            for round_index in range(spec.rounds):
                raw_rounds.append(await _raw_path(redis.url, groups, spec, f"bench:raw:{round_index}"))
                service_rounds.append(await _service_path(address, groups, spec))
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(10)
            redis.stop()
    service_s = statistics.median(r.seconds for r in service_rounds)
    raw_s = statistics.median(r.seconds for r in raw_rounds)
    service = PathResult(service_s, [x for r in service_rounds for x in r.latencies_s])
    raw = PathResult(raw_s, [x for r in raw_rounds for x in r.latencies_s])
    groups_per_s = spec.groups / service.seconds
    raw_groups_per_s = spec.groups / raw.seconds
    return {
        "benchmark": "queue",
        "groups": spec.groups,
        "producers": spec.producers,
        "batch": spec.batch,
        "group_mb": round(mb / spec.groups, 4),
        "groups_per_s": round(groups_per_s, 1),
        "mb_per_s": round(mb / service.seconds, 1),
        "p50_ms": round(_percentile_ms(service.latencies_s, 0.5), 2),
        "p99_ms": round(_percentile_ms(service.latencies_s, 0.99), 2),
        "mean_ms": round(1000 * statistics.fmean(service.latencies_s), 2),
        "raw_groups_per_s": round(raw_groups_per_s, 1),
        "raw_mb_per_s": round(mb / raw.seconds, 1),
        "raw_p50_ms": round(_percentile_ms(raw.latencies_s, 0.5), 2),
        "raw_p99_ms": round(_percentile_ms(raw.latencies_s, 0.99), 2),
        "ratio_to_raw": round(groups_per_s / raw_groups_per_s, 3),
        "rounds": spec.rounds,
        "ratio_by_round": [round(r.seconds / s.seconds, 3) for r, s in zip(raw_rounds, service_rounds, strict=True)],
    }
