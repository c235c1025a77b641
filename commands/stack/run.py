"""Running the local stack until the trainer finishes, with a live progress line and a report."""

from __future__ import annotations

import os
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from commands.stack.config import StackConfig
from commands.stack.launch import LocalStack, prepare_model
from commands.stack.process import ComponentError
from commands.stack.progress import REWARD_KEY, MetricsTail, ProgressLine, queue_depth
from commands.stack.report import RunReport, build_report, plot_reward, read_metrics, write_report
from commands.stack.resume import latest_checkpoint, stop_line
from commands.stack.supervisor import supervised
from relayrl.extras import MissingExtra

# Steps averaged into reward_first and reward_last.
REPORT_WINDOW = 30


@dataclass
class RunOutcome:
    exit_code: int
    run_dir: Path
    report: RunReport | None = None
    # Why the stack stopped when a component failed (the ComponentError's message).
    error: str = ""


def run_stack(
    config: StackConfig,
    quiet: bool,
    keep_alive: bool,
    report: bool = False,
    title: str = "RelayRL",
    monitor: bool = False,
) -> RunOutcome:
    # soft_wrap: without a terminal rich would wrap at 80 columns and split printed commands.
    console = Console(stderr=True, soft_wrap=True)
    outcome: RunOutcome | None = None
    with supervised(None if quiet else sys.stderr, config.stack.restart_policy()) as supervisor:
        stack = LocalStack(config, supervisor)
        resumed = latest_checkpoint(stack.run_dir)
        _save_config(config, stack.run_id, stack.run_dir)
        try:
            if not console.is_terminal:
                _no_progress_bars()
            model_dir = prepare_model(stack)
            started_at = time.time()
            console.print(f"[bold]RelayRL[/] run [cyan]{stack.run_id}[/] in {stack.run_dir}")
            if line := stack.gpu_line():
                console.print(line)
            stack.start(model_dir)
            _print_endpoints(console, stack)
            if monitor:
                from commands.stack.monitor import start_prometheus

                console.print(f"  prometheus {start_prometheus(stack)}  (Grafana: add it as a data source)")
            code = _follow_trainer(console, stack, started_at)
            outcome = RunOutcome(code, stack.run_dir)
            if code == 0 and report:
                outcome.report = _write_report(stack, started_at, title, resumed.step if resumed else 0)
            if code == 0:
                _print_untrained(console, stack)
            if code == 0 and keep_alive:
                console.print(
                    "trainer finished; services stay up until Ctrl-C. Groups pushed from now on (agents through"
                    " the OpenAI endpoint) are queued and never trained."
                )
                while True:
                    supervisor.check_alive(exited_ok=["trainer"])
                    time.sleep(1.0)
        except ComponentError as err:
            console.print(f"[red]stack stopped:[/] {err}")
            outcome = RunOutcome(1, stack.run_dir, error=str(err))
        except KeyboardInterrupt:
            console.print("interrupted; stopping every component")
            if outcome is not None and outcome.exit_code == 0:
                _print_untrained(console, stack)  # --keep-alive: the trainer had finished
            else:
                outcome = RunOutcome(130, stack.run_dir)
    # Every component has stopped here: the trainer wrote its last checkpoint on the way out.
    if outcome.exit_code != 0:
        if not outcome.error and outcome.exit_code != 130:
            console.print(f"[red]trainer exited with code {outcome.exit_code}[/]; logs in {stack.run_dir / 'logs'}")
        console.print(stop_line(stack.run_dir, stack.run_id))
    return outcome


def _save_config(config: StackConfig, run_id: str, run_dir: Path) -> None:
    """The checked config the run started with: ``relayrl export`` finds the base model in it."""
    import yaml

    from commands.stack.export import RUN_CONFIG

    run_dir.mkdir(parents=True, exist_ok=True)
    data = config.model_dump(mode="json", exclude_none=True)
    data["stack"]["run_id"] = run_id
    if config.stack.model_dir is not None:
        data["stack"]["model_dir"] = str(config.stack.model_dir.resolve())
    data["stack"].pop("api_token", None)  # the token stays in ctl.env (owner-readable only)
    (run_dir / RUN_CONFIG).write_text(yaml.safe_dump(data, sort_keys=False))


def _no_progress_bars() -> None:
    # tqdm bars written to a file or a pipe are noise: one line per refresh. Said through the
    # environment, which transformers reads when first imported: importing it here just to say so
    # cost every run over a second of CPU, though only a built-in model's creation shows bars.
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"


def _print_endpoints(console: Console, stack: LocalStack) -> None:
    for name, url in stack.endpoints.http_services().items():
        console.print(f"  {name:<10} {url}")
    console.print(f"  steer it:  relayrl ctl --env-file {stack.ctl_env_file} status --all")


def _follow_trainer(console: Console, stack: LocalStack, started_at: float) -> int:
    """Shows progress until the trainer exits; any other component dying stops the run."""
    tail = MetricsTail(stack.run_dir / "metrics.jsonl")
    # A resumed run's earlier rows were written before started_at: they are history, not progress.
    seen = tail.poll()
    earlier = [row for row in seen if float(row.get("time", 0.0)) < started_at]
    tail.rows = [row for row in seen if float(row.get("time", 0.0)) >= started_at]
    total = int(stack.config.trainer.get("total_steps", 100))
    baseline = max((float(r.get("trainer/processed_samples", 0.0)) for r in earlier), default=0.0)
    line = ProgressLine(total_steps=total, started_at=started_at, baseline_samples=baseline)
    last_printed = 0.0
    # A spinner only on a terminal; elsewhere the line is printed now and then instead.
    spinner = console.status(line.render(None, None)) if console.is_terminal else nullcontext()
    with spinner as status:
        while True:
            stack.supervisor.check_alive(exited_ok=["trainer"])
            tail.poll()
            latest = tail.rows[-1] if tail.rows else None
            text = line.render(latest, queue_depth(stack.endpoints.queue_http))
            if status is not None:
                status.update(text)
            elif time.monotonic() - last_printed > 10:
                console.print(text)
                last_printed = time.monotonic()
            code = stack.trainer_exit_code()
            if code is not None:
                tail.poll()
                if tail.rows:
                    console.print(line.render(tail.rows[-1], None))
                return code
            time.sleep(1.0)


def _print_untrained(console: Console, stack: LocalStack) -> None:
    """Groups still in the queue once the trainer is done are never trained: say so, with their number."""
    from commands.ctl.calls import CallError
    from commands.ctl.components import queue_status

    try:  # the queue's own count (its Prometheus gauge lags by up to stats_refresh_s)
        depth = queue_status(stack.endpoints.queue_grpc, 5.0).queue_size
    except CallError:
        return
    if depth:
        console.print(
            f"[yellow]{depth} trajectory group(s) left in the queue were not trained[/] (the trainer reached"
            f" total_steps={stack.config.trainer.get('total_steps', 100)})"
        )


def _write_report(stack: LocalStack, started_at: float, title: str, resumed_from_step: int) -> RunReport:
    rows = read_metrics(stack.run_dir / "metrics.jsonl")
    report = build_report(
        stack.run_id, rows, REWARD_KEY, REPORT_WINDOW, stack.settings.staleness_bound, started_at, resumed_from_step,
        rollout_replicas=stack.settings.rollout_replicas, trainer_procs=stack.settings.trainer_procs,
    )  # fmt: skip
    write_report(report, stack.run_dir)
    try:
        plot_reward(rows, REWARD_KEY, started_at, stack.run_dir / "reward.png", title=f"{title} ({stack.run_id})")
    except MissingExtra as missing:
        # The run and report.json are complete; only the figure needs the plots extra.
        Console(stderr=True).print(f"[yellow]{missing}[/]")
    return report
