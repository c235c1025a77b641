"""Runs the stages of stages.py one after another within one time budget; see README.md beside it.

Only the standard library: it starts on the GPU host's bare Python, before anything is installed.
Everything it keeps lands under $OUT, written as it goes so a session cut short still returns what
finished (the device tool brings back at most 8 files, so there are 5):

    summary.json   the host (GPU, driver, torch, CPUs) and per stage: status, exit code, seconds,
                   budget, the file holding its figures; the stages that did not fit, with their budget
    install.json   the offline install: torch before and after, relayrl --version, redis-server, what
                   pip put into the venv
    tests.log      pytest's output, test by test, with every test's duration
    bench.jsonl    one line per bench run: stage, run, command, exit code, seconds, the bench's JSON
    logs.tar.gz    every command's stdout and stderr (the last MiB of each), pytest's JUnit XML
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from stages import Run, Stage, select

REPO = Path(__file__).resolve().parents[2]
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"
# Kept back from the session's budget for the last summary and tarball.
RESERVE_S = 10
# After SIGINT (pytest writes its summary, the benches stop their processes), the time left before SIGKILL.
GRACE_S = 15
LOG_TAIL_BYTES = 1 << 20
MARK = "GPU_CHECKS_SESSION"
# What pytest runs first, in this order, then every other GPU test file: the quick and the new first,
# so a call of about 200 s finishes files rather than starting many. A trainer job costs 50 to 90 s
# there (two imports, NCCL, a compile for the tiny model's shapes), an engine test 14 to 26 s; the
# replay tests start two trainer processes each. Files, not folders: given a folder, pytest orders
# its files by the tree, whatever the order of the arguments. GPU_CHECKS_TESTS replaces the list.
TESTS_FIRST = (
    "tests/gpu/test_devices.py",
    "tests/gpu/engine/test_attention_kernels.py",
    "tests/gpu/trainer/test_sft_gpu.py",
    "tests/gpu/trainer/test_trainer_gpu.py",
    "tests/gpu/stack/test_stack_cuda.py",
)


def test_paths() -> list[str]:
    """GPU_CHECKS_TESTS's paths, or TESTS_FIRST then every other GPU test file."""
    if given := os.environ.get("GPU_CHECKS_TESTS"):
        return given.split()
    found = sorted(str(path.relative_to(REPO)) for path in (REPO / "tests/gpu").rglob("test_*.py"))
    return [*TESTS_FIRST, *(path for path in found if path not in TESTS_FIRST)]


@dataclass
class Outcome:
    """One stage's line in summary.json."""

    name: str
    issues: str
    budget_s: int
    status: str = "running"  # ok, failed, timed out, partial, not available, skipped
    rc: int | None = None
    seconds: float = 0.0
    file: str | None = None
    detail: str | None = None
    runs: list[dict] = field(default_factory=list)


class Session:
    def __init__(self, out: Path, budget_s: int, stages: list[Stage]) -> None:
        self.out = out
        self.logs = Path(os.environ.get("GPU_CHECKS_WORK", "/tmp/relayrl-gpu-checks")) / "logs"
        self.venv = Path(os.environ.get("GPU_CHECKS_VENV", "/tmp/relayrl-gpu-venv"))
        self.budget_s = budget_s
        self.stages = stages
        self.started = time.monotonic()
        self.outcomes: list[Outcome] = []
        # A warm machine keeps /tmp: a venv installed by an earlier call serves a session without `install`.
        self.installed = (self.venv / "bin/relayrl").exists()
        self.helps: dict[tuple[str, ...], str] = {}
        self.host: dict[str, object] = {}

    # -- time ---------------------------------------------------------------------------------
    def left_s(self) -> int:
        return round(self.budget_s - RESERVE_S - (time.monotonic() - self.started))

    # -- the environment every command runs in ------------------------------------------------
    def env(self, checkout: bool = True) -> dict[str, str]:
        env = dict(os.environ)
        # The checkout's code, not the bundle's copy of it: the two differ when the tree moved on after
        # `make bundle`. The venv brings the dependencies (and its bin/ the relayrl and redis-server).
        # Not for the install: pip would take the checkout's relayrl as installed already.
        if checkout:
            env["PYTHONPATH"] = str(REPO) + (f":{env['PYTHONPATH']}" if env.get("PYTHONPATH") else "")
        env["PATH"] = f"{self.venv / 'bin'}:{env.get('PATH', '')}" if self.installed else env.get("PATH", "")
        env.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        # Marks every process this session starts (children inherit it), for _end_stragglers.
        env[MARK] = str(os.getpid())
        return env

    def python(self) -> str:
        if self.installed:
            return str(self.venv / "bin/python")
        return str(REPO / ".venv/bin/python") if (REPO / ".venv/bin/python").exists() else sys.executable

    def relayrl(self) -> list[str]:
        return [str(self.venv / "bin/relayrl")] if self.installed else [self.python(), "-m", "commands.cli"]

    # -- running one command ------------------------------------------------------------------
    def call(
        self,
        argv: list[str],
        timeout_s: float,
        stdout: Path,
        stderr: Path | None = None,
        checkout: bool = True,
        env: dict[str, str] | None = None,
    ) -> tuple[int, float, bool]:
        """Runs argv (with ``env`` over the session's environment) in its own process group; at
        timeout_s - GRACE_S the group gets SIGINT, at timeout_s SIGKILL. Returns (exit code, seconds,
        timed out)."""
        start = time.monotonic()
        with stdout.open("wb") as out, stderr.open("wb") if stderr else open(os.devnull, "wb") as err:
            try:
                proc = subprocess.Popen(
                    argv,
                    cwd=REPO,
                    env={**self.env(checkout), **(env or {})},
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err if stderr else subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:  # a command that is not there fails its run, not the session
                (err if stderr else out).write(f"gpu-checks: cannot start {argv[0]}: {exc}\n".encode())
                return 127, 0.0, False
            timed_out = False
            try:
                proc.wait(timeout=max(1.0, timeout_s - GRACE_S))
            except subprocess.TimeoutExpired:
                timed_out = True
                _signal_group(proc.pid, signal.SIGINT)
                try:
                    proc.wait(timeout=GRACE_S)
                except subprocess.TimeoutExpired:
                    _signal_group(proc.pid, signal.SIGKILL)
                    proc.wait()
            # What the command left behind in its group (engines, torchrun workers) must not hold the GPU
            # for the next stage.
            _signal_group(proc.pid, signal.SIGKILL)
        _end_stragglers()
        return proc.returncode, round(time.monotonic() - start, 1), timed_out

    def output(self, argv: list[str], checkout: bool = True, **env: str) -> str:
        """A short command's stdout, stripped, or "" when it fails."""
        try:
            done = subprocess.run(
                argv, cwd=REPO, env={**self.env(checkout), **env}, capture_output=True, text=True, timeout=60
            )
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return done.stdout.strip() if done.returncode == 0 else ""

    # -- stages -------------------------------------------------------------------------------
    def install(self, stage: Stage, outcome: Outcome) -> None:
        bundle = _bundle()
        outcome.file = "install.json"
        record: dict[str, object] = {"bundle": str(bundle) if bundle else None, "python": sys.version.split()[0]}
        record["network"] = _network()
        if bundle is None:
            outcome.status, outcome.detail = "failed", f"no dist/bundle-py{PY}[.tar.gz]; see README.md"
        else:
            record["bundle_mib"] = round(_size(bundle) / 2**20, 1)
            argv = ["bash", "scripts/install-offline.sh", str(bundle), str(self.venv)]
            rc, seconds, timed_out = self.call(argv, stage.budget_s, self.logs / "install.log", checkout=False)
            outcome.rc, outcome.seconds = rc, seconds
            # Without its own relayrl the venv serves nothing: the benches run from the checkout instead.
            self.installed = rc == 0 and (self.venv / "bin/relayrl").exists()
            outcome.status = "ok" if rc == 0 else ("timed out" if timed_out else "failed")
            if rc != 0:
                outcome.detail = _tail(self.logs / "install.log", 5)
            elif not self.installed:
                outcome.status, outcome.detail = "failed", f"{self.venv}/bin/relayrl is missing after the install"
        if self.installed:
            venv_python = str(self.venv / "bin/python")
            # install-offline.sh prints torch's version from the host's Python and then from the venv
            # (and fails if they differ); importing torch takes seconds, so it is read from there.
            said = dict(
                re.findall(
                    r"^install-offline: torch (before|after): (\S+)$", _tail(self.logs / "install.log", 50), re.M
                )
            )
            record["torch_before"], record["torch_after"] = said.get("before"), said.get("after")
            record["torch_unchanged"] = "before" in said and said.get("after") == said["before"]
            # Without the checkout on the path: the installed wheel answers.
            record["relayrl_version"] = self.output([str(self.venv / "bin/relayrl"), "--version"], checkout=False)
            record["redis_server"] = self.output([str(self.venv / "bin/redis-server"), "--version"])
            record["installed"] = _installed(venv_python)
            # Importing torch and transformers again, after the host's first import: whether the
            # seconds a fresh process spends there are a cold disk's (once) or every process's.
            started = time.monotonic()
            self.output([venv_python, "-c", "import torch, transformers"])
            record["import_s"] = round(time.monotonic() - started, 1)
            if not record["torch_unchanged"] or not record["relayrl_version"]:
                outcome.status = "failed"
        _write_json(self.out / "install.json", record)

    def tests(self, stage: Stage, outcome: Outcome) -> None:
        argv = [self.python(), "-m", "pytest", "-m", "gpu", "-n", "0", "-v", "-rfE", "--durations=0"]
        argv += ["-p", "no:cacheprovider", f"--junitxml={self.logs / 'tests.xml'}", *test_paths()]
        outcome.file = "tests.log"
        timeout_s = min(stage.budget_s, self.left_s())
        rc, seconds, timed_out = self.call(argv, timeout_s, self.out / "tests.log")
        outcome.rc, outcome.seconds = rc, seconds
        outcome.status = "ok" if rc == 0 else ("partial" if timed_out else "failed")
        outcome.detail = _pytest_summary(self.out / "tests.log")

    def bench(self, stage: Stage, outcome: Outcome) -> None:
        outcome.file = "bench.jsonl"
        for run in stage.runs:
            line = self.bench_run(stage, run)
            outcome.runs.append({k: line[k] for k in ("run", "status", "rc", "seconds", "budget_s")})
            with (self.out / "bench.jsonl").open("a") as f:
                f.write(json.dumps(line) + "\n")
            outcome.seconds = round(outcome.seconds + line["seconds"], 1)
        statuses = {r["status"] for r in outcome.runs}
        outcome.status = statuses.pop() if len(statuses) == 1 else "partial"
        outcome.rc = max((r["rc"] for r in outcome.runs if r["rc"] is not None), default=None)

    def bench_run(self, stage: Stage, run: Run) -> dict:
        argv = [*self.relayrl(), *run.args]
        line: dict = {"stage": stage.name, "issues": stage.issues, "run": run.name, "budget_s": run.budget_s}
        line.update(command=run.command, rc=None, seconds=0.0)
        missing = self.missing_flags(run.args)
        if missing:
            command = " ".join(_words(run.args))
            return {**line, "status": "not available", "reason": f"relayrl {command} has no {missing}"}
        if self.left_s() < run.budget_s:
            return {**line, "status": "skipped", "reason": f"{self.left_s()} s left of the session's budget"}
        name = f"{stage.name}.{run.name}"
        out, err = self.logs / f"{name}.out", self.logs / f"{name}.err"
        rc, seconds, timed_out = self.call(argv, run.budget_s, out, err, env=dict(run.env))
        line.update(rc=rc, seconds=seconds, status="ok" if rc == 0 else ("timed out" if timed_out else "failed"))
        line["result"] = _last_json_object(out)
        if rc != 0:
            line["stderr_tail"] = _tail(err, 15)
        return line

    def missing_flags(self, args: tuple[str, ...]) -> str | None:
        """The first --flag of args that the command's --help does not list."""
        words = tuple(_words(args))
        if words not in self.helps:
            # Wide enough that no option's name is wrapped in the help's table.
            self.helps[words] = self.output([*self.relayrl(), *words, "--help"], COLUMNS="300")
        if not self.helps[words]:
            return None  # --help itself fails: the run will, and say why
        shown = set(re.findall(r"--[a-z0-9][a-z0-9-]*", self.helps[words]))
        return next((a for a in args if a.startswith("--") and a not in shown), None)

    # -- the whole session --------------------------------------------------------------------
    def run(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "bench.jsonl").write_text("")
        # A warm machine keeps /tmp between calls: the logs of an earlier session must not be packed again.
        shutil.rmtree(self.logs, ignore_errors=True)
        self.logs.mkdir(parents=True)
        self.host = _host(sys.executable)
        for stage in self.stages:
            outcome = Outcome(stage.name, stage.issues, stage.budget_s)
            self.outcomes.append(outcome)
            if worst_case_s(stage, self.left_s()) == 0:
                outcome.status = "skipped"
                outcome.detail = f"{max(self.left_s(), 0)} s left of the session's budget"
                continue
            self.write_summary()
            print(f"gpu-checks: {stage.name} ({stage.issues}), {self.left_s()} s left", flush=True)
            getattr(self, stage.kind)(stage, outcome)
            self.write_summary()
            self.pack_logs()
        self.write_summary(done=True)
        self.pack_logs()
        for o in self.outcomes:
            took = f"{o.seconds:6.1f}s / {o.budget_s}s"
            print(f"gpu-checks: {o.name:17} {o.status:13} rc={o.rc} {took}  {o.detail or ''}")
        return 0 if all(o.status in ("ok", "skipped", "not available") for o in self.outcomes) else 1

    def write_summary(self, done: bool = False) -> None:
        summary = {
            "done": done,
            "budget_s": self.budget_s,
            "elapsed_s": round(time.monotonic() - self.started, 1),
            "host": self.host,
            "stages": [asdict(o) for o in self.outcomes if o.status != "skipped"],
            "skipped": [
                {"name": o.name, "issues": o.issues, "budget_s": o.budget_s, "reason": o.detail}
                for o in self.outcomes
                if o.status == "skipped"
            ],
        }
        _write_json(self.out / "summary.json", summary)

    def pack_logs(self) -> None:
        with tarfile.open(self.out / "logs.tar.gz", "w:gz") as tar:
            for path in sorted(self.logs.iterdir()):
                data = path.read_bytes()[-LOG_TAIL_BYTES:]
                info = tarfile.TarInfo(f"logs/{path.name}")
                info.size, info.mtime = len(data), int(path.stat().st_mtime)
                tar.addfile(info, io.BytesIO(data))


def worst_case_s(stage: Stage, left_s: float) -> int:
    """The seconds a stage may take with left_s left: its budget, less where a stage keeps what
    finished when cut (the tests, from a minute on) or runs only the runs that fit (a bench), 0 where
    nothing of it fits."""
    if stage.kind == "tests":
        return int(min(stage.budget_s, left_s)) if left_s >= min(stage.budget_s, 60) else 0
    if not stage.runs:
        return stage.budget_s if left_s >= stage.budget_s else 0
    taken = 0
    for run in stage.runs:
        if left_s - taken >= run.budget_s:
            taken += run.budget_s
    return taken


def _words(args: tuple[str, ...]) -> list[str]:
    """The sub-command words before the first option: ("bench", "trainer")."""
    words = []
    for a in args:
        if a.startswith("-"):
            break
        words.append(a)
    return words


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _end_stragglers() -> None:
    """Processes this session started that outlived their stage: a server started in a session of its
    own escapes its group's SIGKILL, and would hold GPU memory or cores the next stage needs."""
    ours = f"{MARK}={os.getpid()}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if ours not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            os.kill(int(proc.name), signal.SIGKILL)
        except OSError:  # gone already, or not ours to read
            continue
        print(f"gpu-checks: ended pid {proc.name}, left running by the stage before", file=sys.stderr)


def _bundle() -> Path | None:
    given = os.environ.get("GPU_CHECKS_BUNDLE")
    candidates = [Path(given)] if given else [REPO / f"dist/bundle-py{PY}.tar.gz", REPO / f"dist/bundle-py{PY}"]
    return next((p for p in candidates if p.exists()), None)


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _network() -> str:
    """Whether PyPI answers from here: the install must not need it either way."""
    try:
        socket.create_connection(("pypi.org", 443), timeout=3).close()
    except OSError as err:
        return f"none ({type(err).__name__})"
    return "reachable"


def _installed(python: str) -> list[str]:
    """What pip put into the venv itself (not what it sees of the host's)."""
    code = (
        "import importlib.metadata as m, sysconfig; p = sysconfig.get_path('purelib');"
        "print('\\n'.join(sorted(f\"{d.metadata['Name']}=={d.version}\" for d in m.distributions(path=[p]))))"
    )
    done = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return done.stdout.split()


def _host(python: str) -> dict[str, object]:
    def out(argv: list[str]) -> str:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    versions = "import torch, transformers; print(torch.__version__, transformers.__version__)"
    started = time.monotonic()
    torch_v, _, transformers_v = out([python, "-c", versions]).partition(" ")
    # The session's first import of both, from a cold disk; install.json's import_s repeats it.
    import_s = round(time.monotonic() - started, 1)
    return {
        "gpu": out(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]) or None,
        "python": sys.version.split()[0],
        "torch": torch_v or None,
        "transformers": transformers_v or None,
        "cpus": len(os.sched_getaffinity(0)),
        "cpu_model": _cpu_model(),
        "import_s": import_s,
    }


def _cpu_model() -> str | None:
    """The CPU's model as /proc/cpuinfo names it (a figure's machine names its CPU)."""
    try:
        found = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
    except OSError:
        return None
    return found[1].strip() if found else None


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _last_json_object(path: Path) -> dict | None:
    """A bench's JSON line, read from its stdout (log lines may come before it)."""
    for line in reversed(path.read_text(errors="replace").splitlines()):
        if line.startswith("{"):
            try:
                found = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(found, dict):
                return found
    return None


def _pytest_summary(log: Path) -> str | None:
    """pytest's closing line ("3 passed, 1 failed in 212.4s")."""
    found = re.findall(r"^=+ (.+ in [\d.]+s.*?) =+$", log.read_text(errors="replace"), re.MULTILINE)
    return found[-1] if found else _tail(log, 3)


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n")


def dry_run(stages: list[Stage], budget_s: int) -> int:
    """Each stage's commands and budget, and where the session's budget runs out if every stage takes
    all the time it may (stages that finish early leave their time to the next)."""
    print(f"gpu-checks: session budget {budget_s} s ({RESERVE_S} s kept for the summary)")
    at = 0
    for stage in stages:
        taken = worst_case_s(stage, budget_s - RESERVE_S - at)
        at += taken
        if taken == 0:
            mark = "skipped unless earlier stages finish early"
        else:
            mark = f"ends by {at} s" + (f", cut to {taken} s" if taken < stage.budget_s else "")
        print(f"[{stage.name}] {stage.issues}: {stage.what}; budget {stage.budget_s} s; at worst {mark}")
        if stage.kind == "install":
            bundle = _bundle()
            shown = bundle.relative_to(REPO) if bundle else f"dist/bundle-py{PY}.tar.gz (absent here)"
            print(f"  bash scripts/install-offline.sh {shown} VENV")
        elif stage.kind == "tests":
            print(f"  python -m pytest -m gpu -n 0 -v -rfE --durations=0 {' '.join(test_paths())}")
        for run in stage.runs:
            print(f"  {run.command}   # {run.budget_s} s")
    return 0


def main() -> int:
    stages = select([w for a in sys.argv[1:] for w in a.replace(",", " ").split()])
    budget_s = int(os.environ.get("GPU_CHECKS_BUDGET_S", "540"))
    if os.environ.get("GPU_CHECKS_DRY") == "1":
        return dry_run(stages, budget_s)
    out = os.environ.get("OUT")
    if not out:
        raise SystemExit("gpu-checks: set OUT to the folder the results go to (the device tool sets it)")
    return Session(Path(out), budget_s, stages).run()


if __name__ == "__main__":
    sys.exit(main())
