"""The chaos run: a training stack under seeded random faults, then runs of the same length without faults.

Faults come one at a time, at seeded random gaps, each once the one before has recovered: a
SIGKILL (the stack restarts the component; the trainer resumes from its checkpoint), a SIGSTOP
of a few seconds then SIGCONT (a hang), or a network fault on the proxy in front of redis, the
queue, paramsync or an engine (latency, reset connections, a partition). The component hit is
drawn among those hit least so far, so every kind is covered. Then comes a quiet tail without
faults (:mod:`commands.stack.chaos.quiet`): once the last fault has recovered, nothing more may be
thrown away for age. At the end the trainer is asked to stop (it checkpoints and acknowledges what
it trained) and the run is accounted for.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any, TextIO

from commands.stack.chaos.faults import PROCESS_FAULTS, Fault, FaultTracker
from commands.stack.chaos.ledger import Lineage, VersionWatch, verdict
from commands.stack.chaos.proxy import NETWORK_FAULTS, ProxyFleet
from commands.stack.chaos.quiet import QuietTail, StaleCount, stale_count
from commands.stack.chaos.waste import Waste, queue_waste
from commands.stack.config import StackConfig
from commands.stack.launch import LocalStack, prepare_model
from commands.stack.progress import REWARD_KEY
from commands.stack.report import read_metrics
from commands.stack.supervisor import Supervisor, supervised

KINDS = (*PROCESS_FAULTS, *NETWORK_FAULTS)
# Faults are this far apart (seconds, uniform), after the previous one recovered.
GAP_S = (6.0, 20.0)
HANG_S = (2.0, 8.0)
PARTITION_S = (3.0, 12.0)
LATENCY = ((0.05, 0.5), (5.0, 15.0))  # per-chunk delay, and how long it lasts
REWARD_STEPS = 10  # steps averaged into the reward at the end
STOP_TIMEOUT_S = 180.0
QUIET_TAIL_S = 60.0  # after the faults: half to drain what they left, half counted


class ChaosStack(LocalStack):
    """The local stack with every client connection going through a fault-injecting proxy."""

    def __init__(self, config: StackConfig, supervisor: Supervisor, fleet: ProxyFleet) -> None:
        super().__init__(config, supervisor)
        self.fleet = fleet

    def route(self, target: str, address: str) -> str:
        return self.fleet.add(target, address)


def chaos_config(base: StackConfig, run_id: str, seed: int, total_steps: int) -> StackConfig:
    config = base.model_copy(deep=True)
    s = config.stack
    s.run_id = run_id
    # The promise holds for acknowledged work: with `everysec` a Redis crash forgets up to a
    # second of accepted groups, together with the counter that would show them missing.
    s.redis_appendfsync = "always"
    s.restart_backoff_s = min(s.restart_backoff_s, 0.5)
    s.restart_limit = max(s.restart_limit, 20)
    # A run measured in seconds has no last step for a schedule to decay towards, and the fault-free
    # runs (which know theirs) must train as the chaos run did: the rate stays at lr in both.
    config.trainer = {
        **config.trainer,
        "total_steps": total_steps,
        "seed": seed,
        "test_freq": 0,
        "lr_scheduler_type": "constant",
    }
    return config


@dataclass
class RunResult:
    steps: int
    reward_end: float | None
    wall_s: float
    seed: int


def fault_free_figures(chaos_reward: float | None, baselines: list[RunResult]) -> dict[str, Any]:
    """The fault-free runs, their reward spread, and whether the chaos run's reward lies inside it."""
    rewards = [b.reward_end for b in baselines if b.reward_end is not None]
    spread = (
        {"min": min(rewards), "max": max(rewards), "mean": round(statistics.fmean(rewards), 4)} if rewards else None
    )
    where = None
    if spread is not None and chaos_reward is not None:
        where = "below" if chaos_reward < spread["min"] else "above" if chaos_reward > spread["max"] else "within"
    runs = [
        {"seed": b.seed, "steps": b.steps, "reward_end": b.reward_end, "wall_s": round(b.wall_s)} for b in baselines
    ]
    # "above" is kept apart from "within": near the reward's ceiling a run can end a hair above
    # every fault-free one, which is no harm from faults but is not inside their spread either.
    return {
        "fault_free": {"runs": runs, "reward_end": spread},
        "reward_within_spread": None if where is None else where == "within",
        "reward_vs_spread": where,
    }


class Progress:
    def __init__(self, sink: TextIO | None, started: float) -> None:
        self.sink, self.started, self.last = sink, started, 0.0

    def say(self, tracker: FaultTracker, event: str = "") -> None:
        now = time.time()
        if self.sink is None or (not event and now - self.last < 15):
            return
        self.last = now
        faults = tracker.faults
        recovered = sum(1 for f in faults if f.recovered_at is not None)
        line = f"[{now - self.started:5.0f}s] step {tracker.step} · faults {len(faults)}, recovered {recovered}"
        print(line + (f" · {event}" if event else ""), file=self.sink, flush=True)


def _reward_end(stack: LocalStack) -> float | None:
    last: dict[int, dict[str, Any]] = {}
    for row in read_metrics(stack.run_dir / "metrics.jsonl"):
        if "trainer/global_steps" in row:
            last[int(row["trainer/global_steps"])] = row
    values = [last[s][REWARD_KEY] for s in sorted(last)[-REWARD_STEPS:] if REWARD_KEY in last[s]]
    return round(statistics.fmean(values), 4) if values else None


def _stop_trainer(stack: LocalStack, tracker: FaultTracker) -> None:
    """SIGTERM to the trainer's workers (not torchrun, which would report them failed; a trainer of
    one process is its own worker): each finishes its step, checkpoints and acknowledges, and the
    trainer exits 0."""
    assert stack.trainer is not None and stack.trainer.process is not None
    deadline = time.monotonic() + STOP_TIMEOUT_S
    asked: set[int] = set()
    launcher = {stack.trainer.process.pid} if stack.settings.trainer_procs > 1 else set()
    while stack.trainer_exit_code() is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the trainer did not stop within {STOP_TIMEOUT_S:.0f}s of SIGTERM")
        for pid in set(stack.trainer.pids()) - launcher - asked:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            asked.add(pid)
        tracker.tick()
        time.sleep(0.5)


class Injector:
    def __init__(self, stack: ChaosStack, tracker: FaultTracker, rng: random.Random) -> None:
        self.stack, self.tracker, self.rng = stack, tracker, rng
        self.hits: dict[str, int] = defaultdict(int)

    def _least_hit(self, names: list[str]) -> str:
        fewest = min(self.hits[n] for n in names)
        return self.rng.choice(sorted(n for n in names if self.hits[n] == fewest))

    def inject(self) -> Fault:
        kind = self.rng.choice(KINDS)
        if kind in NETWORK_FAULTS:
            name = self._least_hit(list(self.stack.fleet.proxies))
        else:
            name = self._least_hit([c.name for c in self.stack.supervisor.components])
        self.hits[name] += 1
        if kind == "sigkill":
            return self.tracker.sigkill(name)
        if kind == "sigstop":
            return self.tracker.sigstop(name, round(self.rng.uniform(*HANG_S), 1))
        seconds = (
            0.0
            if kind == "reset"
            else round(self.rng.uniform(*(PARTITION_S if kind == "partition" else LATENCY[1])), 1)
        )
        latency = round(self.rng.uniform(*LATENCY[0]), 2) if kind == "latency" else 0.0
        fault = Fault(kind, name, time.time(), seconds)
        self.tracker.faults.append(fault)
        self.stack.fleet.inject(name, kind, seconds, latency)
        return fault


def _stale_now(stack: LocalStack, tracker: FaultTracker) -> StaleCount:
    from commands.ctl.components import queue_counters

    counters, prompts = queue_counters(stack.endpoints.queue_grpc, timeout_s=10.0)
    return stale_count(tracker.metrics.rows, counters.dropped_by_reason, prompts.abandoned_by_reason)


def run_chaos(
    base: StackConfig,
    duration_s: float,
    seed: int,
    sink: TextIO | None = sys.stderr,
    fault_free_runs: int = 3,
    quiet_s: float = QUIET_TAIL_S,
) -> dict[str, Any]:
    """The chaos run (``duration_s`` of faults, then ``quiet_s`` without), then ``fault_free_runs``
    fault-free runs of the same number of steps (seeds ``seed``, ``seed + 1``, ...), whose spread the
    chaos run's reward at the end is judged against: one fault-free run says nothing about how far
    apart two healthy runs end."""
    run_id = base.stack.run_id or time.strftime("chaos-%Y%m%d-%H%M%S")
    rng = random.Random(seed)
    fleet = ProxyFleet()
    started = time.time()
    progress = Progress(sink, started)
    config = chaos_config(base, run_id, seed, total_steps=1_000_000)
    try:
        with supervised(None, config.stack.restart_policy()) as supervisor:
            stack = ChaosStack(config, supervisor, fleet)
            stack.start(prepare_model(stack))
            tracker, watch = FaultTracker(stack), VersionWatch()
            injector = Injector(stack, tracker, rng)
            engines = {f"engine-{i}": url for i, url in enumerate(stack.endpoints.engines)}
            progress.say(tracker, f"stack up in {time.time() - started:.0f}s; faults start at the first step")
            run_started = time.time()

            def follow() -> None:
                """Half a second of watching: recoveries, restarts, engine versions, progress."""
                for fault in tracker.tick():
                    progress.say(tracker, f"recovered {fault.kind} {fault.component} in {fault.recovery_s:.1f}s")
                watch.poll({n: (u, _pid(stack, n)) for n, u in engines.items()})
                progress.say(tracker)
                time.sleep(0.5)

            next_at: float | None = None
            while time.time() - run_started < duration_s:
                if next_at is None and tracker.step > 0 and not tracker.open_faults():
                    next_at = time.time() + rng.uniform(*GAP_S)
                if next_at is not None and time.time() >= next_at:
                    fault = injector.inject()
                    extra = f" for {fault.duration_s:g}s" if fault.duration_s else ""
                    progress.say(tracker, f"injected {fault.kind} {fault.component}{extra}")
                    next_at = None
                follow()
            settle = time.monotonic() + 60
            while tracker.open_faults() and time.monotonic() < settle:
                follow()
            progress.say(tracker, f"faults over; {quiet_s:g}s without faults, the second half counted")
            drained = time.monotonic() + quiet_s / 2
            while time.monotonic() < drained:
                follow()
            before, counted_from = _stale_now(stack, tracker), time.monotonic()
            while time.monotonic() - counted_from < quiet_s / 2:
                follow()
            quiet = QuietTail.between(before, _stale_now(stack, tracker), time.monotonic() - counted_from)
            ended_at = time.time()
            _stop_trainer(stack, tracker)
            result = verdict(stack.run_dir, stack.endpoints.queue_grpc, stack.settings.staleness_bound, watch, ended_at)
            replica_s = (time.time() - run_started) * config.stack.rollout_replicas
            waste = queue_waste(stack.run_dir, stack.endpoints.queue_grpc, replica_s)
            chaos = RunResult(result.steps, _reward_end(stack), time.time() - run_started, seed)
            restarts = {name: r.restarts for name, r in supervisor.restarts.items()}
            run_dir = str(stack.run_dir)
    finally:
        fleet.close()
    baselines = []
    for i in range(fault_free_runs):
        progress.say(tracker, f"fault-free run {i + 1} of {fault_free_runs}: {chaos.steps} steps, seed {seed + i}")
        baselines.append(run_fault_free(base, f"{run_id}-fault-free-{i}", seed + i, chaos.steps))
    return report(duration_s, seed, tracker.faults, result, chaos, baselines, restarts, run_dir, waste, quiet)


def run_fault_free(base: StackConfig, run_id: str, seed: int, steps: int) -> RunResult:
    config = chaos_config(base, run_id, seed, total_steps=max(steps, 1))
    started = time.time()
    with supervised(None, config.stack.restart_policy()) as supervisor:
        stack = LocalStack(config, supervisor)
        stack.start(prepare_model(stack))
        while stack.trainer_exit_code() is None:
            supervisor.check_alive(exited_ok=["trainer"])
            time.sleep(0.5)
        assert stack.trainer_exit_code() == 0
        return RunResult(max(Lineage.read(stack.run_dir / "groups.jsonl").steps, default=0), _reward_end(stack),
                         time.time() - started, seed)  # fmt: skip


def _pid(stack: LocalStack, name: str) -> int | None:
    component = stack.supervisor.get(name)
    return component.process.pid if component.running() and component.process is not None else None


def report(
    duration_s: float,
    seed: int,
    faults: list[Fault],
    result: Any,
    chaos: RunResult,
    baselines: list[RunResult],
    restarts: dict[str, int],
    run_dir: str,
    waste: Waste | None = None,
    quiet: QuietTail | None = None,
) -> dict[str, Any]:
    by_kind: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for f in faults:
        by_kind[f.kind][f.component] += 1
    recoveries = [f.recovery_s for f in faults if f.recovery_s is not None]
    v = asdict(result)
    return {
        "duration_s": duration_s,
        "seed": seed,
        "faults_total": len(faults),
        "faults": {k: dict(sorted(c.items())) for k, c in sorted(by_kind.items())},
        "recovery_s": {
            "p50": round(statistics.median(recoveries), 2) if recoveries else None,
            "max": round(max(recoveries), 2) if recoveries else None,
        },
        "unrecovered": len(faults) - len(recoveries),
        "lost_groups": v.pop("lost_groups"),
        "trained_twice": v.pop("trained_twice"),
        "staleness_violations": v.pop("staleness_violations"),
        "version_regressions": v.pop("version_regressions"),
        "stalls_over_30s": v.pop("stalls_over_30s"),
        "max_step_gap_s": v.pop("max_step_gap_s"),
        # Groups thrown away for age in the quiet tail's counted half: a surplus that never drains.
        "stale_after_recovery": None if quiet is None else quiet.stale_drops,
        "quiet_tail": None if quiet is None else quiet.to_json(),
        "steps": v.pop("steps"),
        "reward_end": chaos.reward_end,
        **fault_free_figures(chaos.reward_end, baselines),
        "accounting": v,
        # What the faults cost: generation never trained on, by cause, and training redone (waste.py).
        "waste": None if waste is None else waste.to_json(),
        "restarts": restarts,
        "run_dir": run_dir,
    }


def passed(figures: dict[str, Any]) -> bool:
    zeros = (
        "lost_groups",
        "trained_twice",
        "staleness_violations",
        "version_regressions",
        "stalls_over_30s",
        "stale_after_recovery",
    )
    return all(figures[k] == 0 for k in zeros) and figures["unrecovered"] == 0
