"""The fork server starts a Python service as a new interpreter would, without its imports: the
argv, environment, working directory, streams, session and CPUs asked for, the exit status
reported back, and a new interpreter wherever it cannot be exact."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from relayrl.forkserver import ENV_VARIABLE, ForkedProcess, ForkServer, import_time_mismatch
from relayrl.subprocesses import start_process
from tests.processes import process_alive
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
CHILD = [sys.executable, "-m", "tests.integration.forkserver_child"]


@pytest.fixture(scope="module")
def server() -> Iterator[ForkServer]:
    running = ForkServer()
    yield running
    running.stop()


def _env(server: ForkServer, **extra: str) -> dict[str, str]:
    return {**os.environ, ENV_VARIABLE: str(server.path), **extra}


def _report(process: ForkedProcess | subprocess.Popen) -> dict:
    assert process.stdout is not None
    return json.loads(process.stdout.readline())


def test_a_forked_service_gets_what_it_asked_for_and_its_exit_code_comes_back(
    server: ForkServer, tmp_path: Path
) -> None:
    cpu = max(os.sched_getaffinity(0))
    process = start_process(
        [*CHILD, "3", "x y"],
        env=_env(server, CHILD_MARKER="m1", OMP_NUM_THREADS="1", PYTHONPATH=str(tmp_path), HF_HUB_OFFLINE="1"),
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        new_session=True,
        cpus=[cpu],
    )
    assert isinstance(process, ForkedProcess)
    report = _report(process)
    assert report == {
        "argv": ["3", "x y"],
        "cwd": str(REPO),
        "marker": "m1",
        "own_session": True,
        "cpus": [cpu],
        "torch_threads": 1,
        "main": "__main__",
        "stdin": "",
        "preloaded": True,
        "path": [str(REPO), str(tmp_path)],
        "hub_offline": True,
    }
    assert process.wait(60) == 3 and process.poll() == 3
    assert process.stderr is not None and process.stderr.read() == "to stderr\n"


def test_a_signal_that_ends_a_forked_service_is_its_returncode_as_popen_reports_it(server: ForkServer) -> None:
    process = start_process(
        [*CHILD, "wait"], env=_env(server), cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True
    )
    assert isinstance(process, ForkedProcess)
    assert _report(process)["preloaded"]
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(0.2)
    assert process.poll() is None
    process.terminate()
    assert process.wait(30) == -signal.SIGTERM


def test_what_a_fork_cannot_start_exactly_starts_as_a_new_interpreter(server: ForkServer, tmp_path: Path) -> None:
    # A variable the preloaded libraries read at import, set differently from the server's.
    env = _env(server, HF_HOME=str(tmp_path / "hf-home"))
    process = start_process([*CHILD, "0"], env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    assert isinstance(process, subprocess.Popen) and not _report(process)["preloaded"]
    assert process.wait(60) == 0
    # No server at the named path.
    gone = _env(server) | {ENV_VARIABLE: str(tmp_path / "no-server")}
    process = start_process([*CHILD, "0"], env=gone, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    assert isinstance(process, subprocess.Popen) and process.wait(60) == 0


def test_only_variables_read_at_import_must_match_the_servers() -> None:
    server_env = {"HF_HOME": "/a", "RELAYRL_X": "1", "PYTHONPATH": "/p"}
    assert import_time_mismatch({**server_env, "RELAYRL_X": "2", "OMP_NUM_THREADS": "3"}, server_env) is None
    assert import_time_mismatch({**server_env, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}, server_env) is None
    assert import_time_mismatch({**server_env, "HF_HOME": "/b"}, server_env) == "HF_HOME"
    assert import_time_mismatch({"RELAYRL_X": "1", "PYTHONPATH": "/p"}, server_env) == "HF_HOME"
    assert import_time_mismatch({**server_env, "TORCH_LOGS": "+dynamo"}, server_env) == "TORCH_LOGS"


def test_a_forked_service_runs_on_its_requesters_cpus_and_writes_to_its_streams(server: ForkServer) -> None:
    # A requester pinned to one CPU, as the stack pins a trainer: what it starts through the server
    # (which may run anywhere) runs there too, and writes to the requester's own stdout, as a child
    # it started itself would. The requester writes its line in one write, as the child does: the
    # two share the pipe, and an unbuffered print (PYTHONUNBUFFERED) writes a line and its end apart,
    # so the child's line could land between them.
    cpu = max(os.sched_getaffinity(0))
    script = (
        "import os, subprocess, sys\n"
        "from relayrl.subprocesses import start_process\n"
        f"child = start_process({[*CHILD, '0']!r}, env=dict(os.environ), stdin=subprocess.DEVNULL)\n"
        "os.write(1, f'{type(child).__name__}\\n'.encode())\n"
        "sys.exit(child.wait(60))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=_env(server),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=functools.partial(os.sched_setaffinity, 0, [cpu]),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("{")]
    report = json.loads(line)
    assert "ForkedProcess" in done.stdout.splitlines() and report["preloaded"] and report["cpus"] == [cpu]


# A requester that asks for a service ending with it (the child's first argument: "0" exits at once,
# "wait" runs on) and exits at once, or stays with "stay".
_REQUESTER = """
import os, subprocess, sys, time
from relayrl.subprocesses import start_process
child = [sys.executable, "-m", "tests.integration.forkserver_child", sys.argv[1]]
process = start_process(child, env=dict(os.environ), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                        end_with_caller=True)
print(type(process).__name__, process.pid, flush=True)
if sys.argv[2] == "stay":
    time.sleep(600)
"""


def _requester(child_arg: str, then: str) -> list[str]:
    return [sys.executable, "-c", _REQUESTER, child_arg, then]


def test_services_ending_with_their_requesters_leave_the_server_serving(server: ForkServer) -> None:
    # Each service ends about when its hasty requester does, so the server sees both ends in one
    # round as often as one after the other.
    for _ in range(8):
        done = subprocess.run(
            _requester("0", "exit"), env={**_env(server), "PYTHONPATH": str(REPO)},
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0 and done.stdout.startswith("ForkedProcess "), done.stdout + done.stderr
    assert server.process.poll() is None, "the fork server exited"
    process = start_process([*CHILD, "0"], env=_env(server), cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    assert isinstance(process, ForkedProcess) and process.wait(60) == 0


def test_a_service_that_ends_with_its_requester_is_stopped_when_the_requester_is_killed(server: ForkServer) -> None:
    requester = subprocess.Popen(
        _requester("wait", "stay"), env={**_env(server), "PYTHONPATH": str(REPO)},
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert requester.stdout is not None
        kind, pid = requester.stdout.readline().split()
        assert kind == "ForkedProcess" and process_alive(int(pid))
        requester.kill()
        requester.wait(30)
        wait_until(lambda: not process_alive(int(pid)), 20, "the service to end with its requester")
    finally:
        if requester.poll() is None:
            requester.kill()
