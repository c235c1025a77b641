"""The status report as rich tables: a one-line summary, then components, replicas and queue."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from commands.ctl.deployment import ENDPOINT_VARIABLE, DeploymentStatus, Outcome


def _rate(value: float) -> str:
    return f"{value / 1000:.1f}k" if value >= 1000 else f"{value:.1f}"


def summary_line(status: DeploymentStatus) -> str:
    parts = []
    if status.paramsync is not None:
        parts.append(f"policy v{status.paramsync.latest_version}")
    if status.trainer is not None:
        t = status.trainer
        state = "consuming" if t.consuming else "paused"
        parts.append(f"trainer step {t.step}/{t.total_steps} at v{t.version} ({state})")
    if status.queue is not None:
        q = status.queue
        parts.append(f"queue {q.queue_size} queued + {q.pending} pending / {q.capacity}")
        parts.append(f"staleness mean {q.avg_sample_age_versions:.2f} max {q.max_sample_age_versions:g} versions")
    if status.rollout:
        samples = sum(r.samples_per_s for r in status.rollout)
        tokens = sum(r.tokens_per_s for r in status.rollout)
        parts.append(f"{_rate(samples)} samples/s, {_rate(tokens)} tokens/s over {len(status.rollout)} replicas")
    return " · ".join(parts) if parts else "no component answered"


def _components(status: DeploymentStatus) -> Table:
    table = Table(title="Components", title_justify="left", expand=False)
    for column in ("component", "endpoint", "state", "details"):
        table.add_column(column)
    for r in status.rollout:
        state = f"paused ({r.pause_mode})" if r.paused else "running"
        table.add_row(
            f"rollout {r.replica_id}",
            r.endpoint,
            Text(state, style="yellow" if r.paused else "green"),
            f"v{r.weight_version} (lag {r.lag}), {r.in_flight} in flight,"
            f" engine {'ready' if r.engine_ready else 'DOWN'}",
        )
    if (t := status.trainer) is not None:
        table.add_row(
            "trainer",
            t.endpoint,
            Text("consuming" if t.consuming else "paused", style="green" if t.consuming else "yellow"),
            f"step {t.step}/{t.total_steps}, v{t.version}, {t.buffered_groups} buffered, "
            f"{t.param_sync_count} versions published, {t.world_size} rank{'s' if t.world_size != 1 else ''}"
            + (", checkpoint requested" if t.checkpoint_requested else ""),
        )
    if (q := status.queue) is not None:
        drops = ", ".join(f"{k} {v}" for k, v in sorted(q.dropped_by_reason.items()) if v) or "none"
        table.add_row(
            "queue",
            q.endpoint,
            Text("ok", style="green"),
            f"{q.queue_size} queued, {q.pending} pending, capacity {q.capacity}; produced {q.total_produced}, "
            f"consumed {q.total_consumed}; drops: {drops}"
            + (f"; {q.duplicate_groups} duplicate(s)" if q.duplicate_groups else "")
            + f"; prompts {q.prompts_waiting} waiting, "
            f"{q.prompts_leased} leased",
        )
    if (p := status.paramsync) is not None:
        lagging = sum(1 for r in p.replicas if r.lag_versions > 0)
        table.add_row(
            "paramsync",
            p.endpoint,
            Text("ok", style="green"),
            f"latest v{p.latest_version}, {len(p.replicas)} replicas, {lagging} behind",
        )
    for component in status.not_configured:
        table.add_row(component, "—", Text("not configured", style="dim"), f"set {ENDPOINT_VARIABLE[component]}")
    return table


def _rollout_replicas(status: DeploymentStatus) -> Table:
    table = Table(title="Rollout replicas", title_justify="left")
    for column in ("replica", "state", "version", "lag", "in flight", "leases", "tokens/s", "samples/s", "errors"):
        table.add_column(column, justify="left" if column in ("replica", "state") else "right")
    for r in status.rollout:
        table.add_row(
            r.replica_id,
            f"paused ({r.pause_mode})" if r.paused else "running",
            str(r.weight_version),
            Text(str(r.lag), style="red" if r.lag > 1 else ""),
            str(r.in_flight),
            str(r.leases_held),
            _rate(r.tokens_per_s),
            _rate(r.samples_per_s),
            str(r.generation_errors),
        )
    return table


def _weight_versions(status: DeploymentStatus) -> Table:
    assert status.paramsync is not None
    table = Table(title=f"Weight versions (latest v{status.paramsync.latest_version})", title_justify="left")
    for column in ("replica", "version", "lag", "state", "failures", "last error"):
        table.add_column(column)
    for r in status.paramsync.replicas:
        table.add_row(
            r.replica_id,
            str(r.version),
            Text(str(r.lag_versions), style="red" if r.lag_versions > 1 else ""),
            Text(r.state, style="red" if r.state == "lagging" else ""),
            str(r.consecutive_failures),
            r.last_error or "",
        )
    return table


def _restarts(status: DeploymentStatus) -> Table:
    table = Table(title="Restarts (local stack)", title_justify="left")
    for column in ("component", "state", "restarts", "last exit code"):
        table.add_column(column, justify="left" if column in ("component", "state") else "right")
    for name, r in sorted(status.restarts.items()):
        running = bool(r.get("running"))
        code = r.get("last_exit_code")
        table.add_row(
            name,
            Text("running" if running else "restarting", style="green" if running else "yellow"),
            Text(str(r.get("restarts", 0)), style="yellow" if r.get("restarts") else ""),
            "" if code is None else str(code),
        )
    return table


def print_status(console: Console, status: DeploymentStatus) -> None:
    console.print(Text(summary_line(status), style="bold"))
    console.print(_components(status))
    if status.restarts:
        console.print(_restarts(status))
    if status.rollout:
        console.print(_rollout_replicas(status))
    if status.paramsync is not None and status.paramsync.replicas:
        console.print(_weight_versions(status))
    # Errors go on their own lines, unwrapped, so the endpoint and cause read (and copy) whole.
    for failure in status.failures:
        console.print(
            Text(f"✗ {failure.component}: {failure.endpoint}: {failure.cause}", style="bold red"), soft_wrap=True
        )


def print_outcomes(console: Console, outcomes: list[Outcome]) -> None:
    for o in outcomes:
        where = f"{o.component} {o.endpoint}" if o.endpoint else o.component
        line = Text(f"✓ {where}: {o.message}") if o.ok else Text(f"✗ {where}: {o.message}", style="bold red")
        console.print(line, soft_wrap=True)
