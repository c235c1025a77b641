"""``relayrl bench weights``: one weight version from the trainer's step end to every engine, by stage.

For each replica count N the bench starts the local stack without its trainer (redis, queue,
paramsync, N built-in engines each with its rollout replica: the replica subscribes, fetches and
applies, and it needs the queue to start), then a 2-rank torchrun job
(:mod:`services.trainer.publish_bench`) holding the FSDP2-sharded model. It asks that job for
``--versions`` versions, one after another; each is perturbed, gathered and uploaded by the
trainer's own publish code, and the next is asked for only once every replica holds the last.
No process is pinned to CPUs unless ``--cpus auto`` asks for a training stack's placement
(:data:`CPU_PLACEMENTS` says why).
Per version it records:

- gather and upload seconds, from the trainer;
- fetch, apply and paused seconds at each replica: per-version deltas of the rollout's
  ``relayrl_rollout_weight_{fetch,apply}_seconds`` and ``relayrl_rollout_generation_paused_seconds``;
  and the pause as each engine's scheduler saw it (``engine_paused_s``, from
  ``relayrl_engine_generation_paused_seconds``), which the pause targets use;
- first token: a light stream of one-token ``/generate`` requests runs against every engine the
  whole time; seconds from the step end to the first answer generated with the new version;
- applied / total: seconds from the step end to each replica's report in paramsync's version
  table, and to the last of them.

Peak resident memory (VmHWM) of trainer rank 0, paramsync and each engine is reset once the stack
is up and read after the last version, so it is the peak of the weight path, not of start-up;
its growth over the resident size at the reset (``above_start_bytes``) is what the weight path
itself added, the process's libraries and rank 0's shard left out. ``cpus`` lists the CPUs each of
those processes was allowed to run on, read from the kernel.
After the runs the references move the same byte count: loopback TCP into another process, and
one memcpy. Medians leave out the first version (it pays one-off costs; reported apart).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import httpx
import typer

from commands.stack.bench import PRESETS, _init_model
from commands.stack.config import StackConfig, StackSettings
from commands.stack.launch import HOST, LocalStack
from commands.stack.process import ComponentSpec
from commands.stack.progress import read_samples
from commands.stack.supervisor import Supervisor, supervised
from commands.stack.weights_figures import (
    ENGINE_HISTOGRAMS,
    ROLLOUT_HISTOGRAMS,
    Histogram,
    VersionSample,
    bench_result,
    replica_run_figures,
)
from relayrl import http_client

if TYPE_CHECKING:
    from services.trainer.publish_bench import PublishedVersion

TRAINER_RANKS = 2
# ``stack.cpus`` values the bench accepts. Its default is ``off``: ``auto`` keeps a trainer's CPUs
# for training, but this trainer only publishes, so under ``auto`` half the machine would wait on
# it while paramsync, every replica and every engine share the other half. On 2 cores two
# replicas' applies then share one core (``base``, 2 replicas: median 1.65x one replica's
# seconds under ``auto``, 1.27x under ``off``; README, "Benchmarks").
CPU_PLACEMENTS = ("off", "auto")
# One token from a short prompt: each answer says which version generated it, at little cost.
PROBE_REQUEST = {"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
POLL_S = 0.005

T = TypeVar("T")


async def until(
    check: Callable[[], Awaitable[T | None]], what: str, timeout_s: float, supervisor: Supervisor | None = None
) -> T:
    """``check()``'s first truthy value; TimeoutError naming ``what`` after ``timeout_s``.

    Also stops at once, naming it, when a component of the stack has died.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value:
            return value
        if supervisor is not None:
            supervisor.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"bench weights: waited {timeout_s:.0f}s for {what}")
        await asyncio.sleep(POLL_S)


class TokenStream:
    """One-token ``/generate`` requests to one engine, back to back; notes when each version first answers."""

    def __init__(self, http: httpx.AsyncClient, engine_url: str) -> None:
        self._http = http
        self._url = f"{engine_url}/generate"
        self.first_at_unix_s: dict[int, float] = {}
        self._seen = -1
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            response = await self._http.post(self._url, json=PROBE_REQUEST)
            response.raise_for_status()
            at = time.time()
            version = int(response.json()["meta_info"]["weight_version"])
            # A version the stream never saw answer (replaced before a request finished) first
            # answered when a later one did.
            for v in range(self._seen + 1, version + 1):
                self.first_at_unix_s[v] = at
            self._seen = max(self._seen, version)

    async def first_at(self, version: int) -> float | None:
        assert self.task is not None
        if self.task.done():
            self.task.result()  # raises what stopped the stream
            raise RuntimeError(f"the /generate stream to {self._url} stopped")
        return self.first_at_unix_s.get(version)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


class TrainerLink:
    """The bench's side of the control connection to trainer rank 0 (see services/trainer/publish_bench.py)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout_s: float) -> None:
        self._reader, self._writer, self._timeout_s = reader, writer, timeout_s

    async def receive(self, what: str) -> dict[str, Any]:
        try:
            line = await asyncio.wait_for(self._reader.readline(), self._timeout_s)
        except TimeoutError:
            raise TimeoutError(f"bench weights: waited {self._timeout_s:.0f}s for trainer rank 0's {what}") from None
        if not line:
            raise ConnectionError(f"trainer rank 0 closed the control connection before its {what}")
        return json.loads(line)

    async def send(self, message: dict[str, Any]) -> None:
        self._writer.write((json.dumps(message) + "\n").encode())
        await self._writer.drain()

    async def publish(self, version: int) -> PublishedVersion:
        from services.trainer.publish_bench import PublishedVersion

        await self.send({"version": version})
        return PublishedVersion(**await self.receive(f"publish of version {version}"))

    async def close(self) -> None:
        await self.send({"stop": True})
        self._writer.close()
        with contextlib.suppress(ConnectionError):
            await self._writer.wait_closed()


def reset_peak_memory(pid: int) -> None:
    """Sets the process's VmHWM back to its current resident size (Linux's clear_refs 5)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def peak_memory_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmHWM")


def read_histograms(url: str, families: Mapping[str, str]) -> dict[str, Histogram]:
    samples, totals = read_samples(url), {}
    for stage, family in families.items():
        total, count = samples.get(f"{family}_sum"), samples.get(f"{family}_count")
        if total is None or count is None:
            raise RuntimeError(f"{url}/metrics has no {family}")
        totals[stage] = Histogram(total, count)
    return totals


async def stage_histograms(rollouts: dict[str, str], engines: dict[str, str]) -> dict[str, dict[str, Histogram]]:
    """Every replica's and every engine's stage histograms now, by name."""
    read = [(name, url, ROLLOUT_HISTOGRAMS) for name, url in rollouts.items()]
    read += [(name, url, ENGINE_HISTOGRAMS) for name, url in engines.items()]
    return {name: await asyncio.to_thread(read_histograms, url, families) for name, url, families in read}


def _stack_config(
    work: Path, model_dir: Path, replicas: int, timeout_s: float, lora_rank: int, cpus: str
) -> StackConfig:
    from services.trainer.publish_bench import LORA_ALPHA

    return StackConfig(
        stack=StackSettings(
            run_id=f"weights-{replicas}",
            runs_dir=work / "runs",
            model_dir=model_dir,
            rollout_replicas=replicas,
            trainer_procs=TRAINER_RANKS,
            ready_timeout_s=timeout_s,
            # A restarted component would pay start-up costs inside a version's figures: fail instead.
            restart="never",
            cpus=cpus,
        ),
        # An adapter version is loaded with the trainer's alpha, which the tensors do not carry.
        rollout={"lora_alpha": LORA_ALPHA} if lora_rank else {},
    )


def _start_trainer(
    stack: LocalStack, supervisor: Supervisor, model_dir: Path, control_port: int, lora_rank: int
) -> None:
    argv = [
        sys.executable, "-m", "relayrl.torchrun",
        "--standalone", "--nproc-per-node", str(TRAINER_RANKS),
        "-m", "services.trainer.publish_bench", str(model_dir), str(control_port), str(lora_rank),
    ]  # fmt: skip
    (stack.run_dir / "logs").mkdir(parents=True, exist_ok=True)
    supervisor.start(
        ComponentSpec(
            name="trainer",
            argv=argv,
            env={"OMP_NUM_THREADS": str(stack.cpus.trainer_threads)},
            log_file=stack.run_dir / "logs" / "trainer.log",
            cpus=stack.cpus.trainer_cpus,
        )
    )


def _accept_trainer(server: socket.socket, supervisor: Supervisor, timeout_s: float) -> socket.socket:
    """Rank 0's connection, once it has loaded and sharded the model; fails at once if the job dies."""
    deadline = time.monotonic() + timeout_s
    server.settimeout(0.2)
    while True:
        try:
            conn, _ = server.accept()
            conn.setblocking(False)
            return conn
        except TimeoutError:
            supervisor.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"bench weights: waited {timeout_s:.0f}s for trainer rank 0 to load the model and connect"
                ) from None


async def _measure(
    stack: LocalStack, supervisor: Supervisor, conn: socket.socket, versions: int, timeout_s: float
) -> tuple[list[VersionSample], dict[str, int], dict[str, int], dict[str, list[int]]]:
    """Each version's sample; each measured process's peak and starting resident bytes, and the
    CPUs it may run on."""
    from services.paramsync.client import ParamSyncClient

    reader, writer = await asyncio.open_connection(sock=conn)
    trainer = TrainerLink(reader, writer, timeout_s)
    trainer_pid = int((await trainer.receive("hello"))["pid"])
    await trainer.send({"paramsync": stack.endpoints.paramsync_grpc})
    rollouts = {f"rollout-{i}": url for i, url in enumerate(stack.endpoints.rollouts_http)}
    engines = {f"engine-{i}": url for i, url in enumerate(stack.endpoints.engines)}
    async with (
        ParamSyncClient(stack.endpoints.paramsync_grpc) as paramsync,
        http_client.async_client(timeout=60) as http,
    ):

        async def table() -> dict[str, Any]:
            return {r.replica_id: r for r in (await paramsync.list_replicas()).replicas}

        async def subscribed() -> bool:
            return set(rollouts) <= set(await table())

        await until(subscribed, f"replicas {sorted(rollouts)} to subscribe to paramsync", timeout_s, supervisor)
        _phase("trainer connected, replicas subscribed")
        streams = {f"engine-{i}": TokenStream(http, url) for i, url in enumerate(stack.endpoints.engines)}
        for stream in streams.values():
            stream.start()
        for name, stream in streams.items():
            await until(lambda s=stream: s.first_at(0), f"{name}'s first /generate answer", timeout_s, supervisor)
        pids = {"trainer_rank0": trainer_pid, "paramsync": _pid(supervisor, "paramsync")}
        pids.update({name: _pid(supervisor, name) for name in streams})
        # Where each process may run, as the kernel has it: the placement the figures come from.
        cpus = {name: sorted(os.sched_getaffinity(pid)) for name, pid in pids.items()}
        for pid in pids.values():
            reset_peak_memory(pid)
        # What each process held before the first version: the peak's growth during the weight path.
        starts = {name: peak_memory_bytes(pid) for name, pid in pids.items()}
        samples = []
        before = await stage_histograms(rollouts, engines)
        for version in range(1, versions + 1):
            published = await trainer.publish(version)

            async def applied(v: int = version) -> dict[str, float] | None:
                rows = await table()
                held = all(rows[r].version >= v for r in rollouts)
                return {r: rows[r].updated_at_unix_s for r in rollouts} if held else None

            applied_at = await until(applied, f"every replica to apply version {version}", timeout_s, supervisor)
            first_token_at = {
                name: await until(
                    lambda s=stream, v=version: s.first_at(v),
                    f"{name} to answer with version {version}",
                    timeout_s,
                    supervisor,
                )
                for name, stream in streams.items()
            }
            after = await stage_histograms(rollouts, engines)
            samples.append(VersionSample(published, applied_at, first_token_at, before, after))
            total_s = max(applied_at.values()) - published.step_end_unix_s
            _phase(f"version {version} applied at every replica {total_s:.3f}s after the step end")
            before = after
        peaks = {name: peak_memory_bytes(pid) for name, pid in pids.items()}
        for stream in streams.values():
            await stream.stop()
        await trainer.close()
    return samples, peaks, starts, cpus


def _pid(supervisor: Supervisor, name: str) -> int:
    process = supervisor.get(name).process
    assert process is not None
    return process.pid


def run_replicas(
    work: Path,
    model_dir: Path,
    replicas: int,
    versions: int,
    timeout_s: float,
    cpus: str,
    lora_rank: int = 0,
) -> dict[str, Any]:
    """The figures of ``versions`` versions through a fresh stack with ``replicas`` replicas (each
    version a rank-``lora_rank`` LoRA adapter when above 0), its processes placed by ``cpus``
    (``stack.cpus``: ``off`` or ``auto``)."""
    config = _stack_config(work, model_dir, replicas, timeout_s, lora_rank, cpus)
    with supervised(None, config.stack.restart_policy()) as supervisor:
        stack = LocalStack(config, supervisor)
        with socket.create_server((HOST, 0)) as server:
            # The trainer loads and shards the model on its own CPUs while the stack starts.
            _start_trainer(stack, supervisor, model_dir, server.getsockname()[1], lora_rank)
            stack.start(model_dir, training=False)
            _phase(f"stack up: paramsync, {replicas} engine(s) and replica(s)")
            conn = _accept_trainer(server, supervisor, timeout_s)
        samples, peaks, starts, cpus_by_process = asyncio.run(_measure(stack, supervisor, conn, versions, timeout_s))
        trainer = supervisor.get("trainer")
        assert trainer.process is not None
        trainer.process.wait(timeout_s)
        if trainer.process.returncode != 0:
            raise RuntimeError(f"the bench's trainer exited with {trainer.process.returncode}; see {stack.run_dir}")
    return {**replica_run_figures(samples, peaks, TRAINER_RANKS, starts), "cpus": cpus_by_process}


def memcpy_seconds(size_bytes: int) -> float:
    """One copy of ``size_bytes`` between two buffers already in memory."""
    source = bytearray(b"\x5a") * size_bytes
    target = bytearray(b"\x00") * size_bytes
    started = time.perf_counter()
    target[:] = source
    return time.perf_counter() - started


def raw_tcp_seconds(size_bytes: int) -> float:
    from services.paramsync.bench import raw_seconds

    payload = bytearray(b"\x5a") * size_bytes
    return raw_seconds(memoryview(payload))


def _parse_replicas(text: str) -> list[int]:
    try:
        counts = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        counts = []
    if not counts or counts[0] < 1:
        raise typer.BadParameter(f"expected replica counts such as 1,2; got {text!r}", param_hint="--replicas")
    return counts


def render_table(result: dict[str, Any]) -> str:
    from io import StringIO

    from rich.console import Console
    from rich.table import Table

    counts = list(result["by_replicas"])
    adapter = f", LoRA rank {result['lora_rank']}" if result["lora_rank"] else ""
    table = Table(
        title=f"bench weights: {result['preset']} preset{adapter}, {result['model_bytes'] / 1e6:.2f} MB per version"
    )
    table.add_column("median over versions 2.., seconds")
    for count in counts:
        table.add_column(f"{count} replica(s)", justify="right")
    stages = ("gather_s", "upload_s", "fetch_s", "apply_s", "paused_s", "engine_paused_s", "first_token_s")
    for key in (*stages, "applied_s", "total_s"):
        table.add_row(key, *(_cell(result["by_replicas"][c]["median"][key]) for c in counts))
    table.add_row("ratio_to_raw_tcp", *(f"{result['by_replicas'][c]['ratio_to_raw_tcp']:.2f}" for c in counts))
    table.add_row(
        "first version total_s", *(_cell(result["by_replicas"][c]["first_version"]["total_s"]) for c in counts)
    )
    out = StringIO()
    console = Console(file=out, width=120)
    console.print(table)
    for count in counts:
        peaks = result["by_replicas"][count]["peak_memory"]
        console.print(
            f"peak memory, {count} replica(s): " + ", ".join(f"{n} {p['x_model']:.2f}x" for n, p in peaks.items())
        )
    console.print(f"raw TCP {result['raw_tcp_s']:.4f}s, memcpy {result['memcpy_s']:.4f}s for the same bytes")
    console.print(f"targets: {result['targets']}")
    return out.getvalue()


def _cell(value: float | dict[str, float]) -> str:
    if isinstance(value, dict):
        return " ".join(f"{v:.4f}" for v in value.values())
    return f"{value:.4f}"


def _phase(message: str) -> None:
    typer.echo(f"[bench weights {time.strftime('%H:%M:%S')}] {message}", err=True)


def bench(
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON line only.")] = False,
    preset: Annotated[str, typer.Option(help="Model preset: tiny, small or base (Qwen2.5-0.5B's shape).")] = "tiny",
    replicas: Annotated[str, typer.Option(help="Replica counts, each measured on a fresh stack, e.g. 1,2.")] = "1,2",
    versions: Annotated[
        int,
        typer.Option(
            min=2,
            help="Versions published per replica count; the first is reported apart, the medians cover the"
            " rest. Paramsync's first keep_versions + 1 versions land in fresh memory (on base, seconds"
            " each): the default leaves them a minority of the medians' versions.",
        ),
    ] = 8,
    model_dir: Annotated[
        Path | None, typer.Option(help="Use this model directory instead of creating the preset's in a temp dir.")
    ] = None,
    timeout_s: Annotated[float, typer.Option(help="Longest any one wait of the bench may take, seconds.")] = 300,
    lora_rank: Annotated[
        int,
        typer.Option(
            min=0,
            help="Publish a LoRA adapter of this rank (all-linear, as the trainer's lora_rank) instead of every"
            " weight; each replica loads it into its engine as an adapter. 0: the whole model.",
        ),
    ] = 0,
    cpus: Annotated[
        str,
        typer.Option(
            help="Where the processes run (stack.cpus): off lets them use every CPU; auto pins them as a training"
            " stack does (the engines and services on half the CPUs, the trainer on the rest).",
        ),
    ] = "off",
) -> None:
    """The weight path at a preset's size: trainer gather and upload, fetch, apply, pause, first token, memory."""
    if preset not in PRESETS:
        raise typer.BadParameter(
            f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}", param_hint="--preset"
        )
    if cpus not in CPU_PLACEMENTS:
        raise typer.BadParameter(
            f"unknown placement {cpus!r}; choose one of {', '.join(CPU_PLACEMENTS)}", param_hint="--cpus"
        )
    counts = _parse_replicas(replicas)
    from commands.stack.cpus import plan_cpus

    cpu_split = plan_cpus(cpus, replicas=counts[-1], trainer_procs=TRAINER_RANKS).describe()
    _phase(f"{preset} preset, CPUs {cpu_split}")
    with tempfile.TemporaryDirectory(prefix="relayrl-bench-weights-") as tmp:
        work = Path(tmp)
        if model_dir is None:
            _phase(f"creating the {preset} model")
            model_dir = _init_model(work, preset)
        runs = {}
        for count in counts:
            _phase(f"{count} replica(s), {versions} versions")
            runs[count] = run_replicas(work, model_dir.resolve(), count, versions, timeout_s, cpus, lora_rank)
    model_bytes = runs[counts[0]]["model_bytes"]
    _phase(f"references: raw TCP and memcpy of {model_bytes / 1e6:.1f} MB")
    raw_s, memcpy_s = raw_tcp_seconds(model_bytes), memcpy_seconds(model_bytes)
    result = bench_result(preset, versions, runs, raw_s, memcpy_s, cpu_split, lora_rank)
    typer.echo(json.dumps(result) if json_output else render_table(result))
