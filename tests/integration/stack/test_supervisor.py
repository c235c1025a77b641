"""Process supervision: readiness, failures named by component, and no orphans."""

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from commands.stack.process import ComponentError, ComponentSpec
from commands.stack.restart import RestartPolicy, RestartRecord
from commands.stack.supervisor import supervised
from relayrl.forkserver import ENV_VARIABLE as FORKSERVER_VARIABLE
from relayrl.forkserver import ForkServer
from tests.processes import process_alive
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[3]

# A parent that starts a long-lived child, as torchrun does with its workers.
PARENT_WITH_CHILD = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print("child", child.pid, flush=True)
time.sleep(600)
"""


def _child_pid(component) -> int:
    def reported() -> int | None:
        for line in component.recent_output().splitlines():
            if line.startswith("child "):
                return int(line.split()[1])
        return None

    return wait_until(reported, 10, "the child to report its pid")


def test_stopping_the_stack_leaves_no_process_behind():
    sink = io.StringIO()
    with supervised(sink) as stack:
        component = stack.start(ComponentSpec("worker", [sys.executable, "-c", PARENT_WITH_CHILD]))
        child = _child_pid(component)
        parent = component.process.pid
        assert process_alive(child)
    assert not process_alive(parent) and not process_alive(child)
    assert "[worker] child" in sink.getvalue()


CRASHES_AFTER_FIRST_START = """
import os, sys, time
first = not os.path.exists(sys.argv[1])
open(sys.argv[1], "w").close()
print("boom", flush=True)
if first:
    time.sleep(1)
sys.exit(4)
"""

# Appends "term NAME" on SIGTERM, then waits (up to 20 s) for every name in PEERS to have done the
# same before it appends "exit NAME" and exits: members of a wave that were stopped one after the
# other would each wait out the 20 s.
STOPS_WITH_PEERS = """
import os, signal, sys, time
log, name, peers = sys.argv[1], sys.argv[2], sys.argv[3:]
def on_term(*_):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(log, "a") as f:
        f.write(f"term {name}\\n")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not all(f"term {p}" in open(log).read() for p in peers):
        time.sleep(0.05)
    with open(log, "a") as f:
        f.write(f"exit {name}\\n")
    os._exit(0)
signal.signal(signal.SIGTERM, on_term)
open(f"{log}.{name}.up", "w").close()
time.sleep(600)
"""


def test_components_started_together_stop_together_after_those_started_later(tmp_path):
    log = tmp_path / "stops.log"

    def spec(name: str, *peers: str) -> ComponentSpec:
        argv = [sys.executable, "-c", STOPS_WITH_PEERS, str(log), name, *peers]
        return ComponentSpec(name, argv, ready=(tmp_path / f"{log.name}.{name}.up").exists)

    with supervised(io.StringIO()) as stack:
        stack.start(spec("first"))
        stack.start_all([spec("a", "b"), spec("b", "a")])
        stack.start(spec("last"))
    events = log.read_text().splitlines()
    assert events[:2] == ["term last", "exit last"]
    # Both members of the wave got SIGTERM before either exited, and the earlier wave only after both.
    assert sorted(events[2:4]) == ["term a", "term b"] and sorted(events[4:6]) == ["exit a", "exit b"]
    assert events[6:] == ["term first", "exit first"]


def test_component_that_exits_early_is_named_with_its_output():
    script = "import sys; print('cannot bind port 1', flush=True); sys.exit(3)"
    with pytest.raises(ComponentError) as err, supervised(io.StringIO()) as stack:
        stack.start(ComponentSpec("queue", [sys.executable, "-c", script], ready=lambda: False, hint="free the port"))
    message = str(err.value)
    assert message.startswith("queue: exited with code 3")
    assert "cannot bind port 1" in message and "free the port" in message


def test_missing_program_is_named():
    with (
        pytest.raises(ComponentError, match=r"(?s)redis: cannot run 'no-such-redis-server'.*apt-get"),
        supervised() as stack,
    ):
        stack.start(ComponentSpec("redis", ["no-such-redis-server"], hint="apt-get install redis-server"))


def test_not_ready_in_time_stops_the_stack():
    with pytest.raises(ComponentError, match="engine-0: not ready after"), supervised(io.StringIO()) as stack:
        stack.start(
            ComponentSpec("engine-0", [sys.executable, "-c", "import time; time.sleep(60)"], ready=lambda: False,
                          ready_timeout_s=0.5)
        )  # fmt: skip
    assert not stack.components[0].running()


def test_a_component_that_dies_later_is_reported():
    with supervised(io.StringIO()) as stack:
        component = stack.start(ComponentSpec("rollout-0", [sys.executable, "-c", "import time; time.sleep(0.3)"]))
        component.process.wait(timeout=60)
        with pytest.raises(ComponentError, match="rollout-0: exited with code 0"):
            stack.check_alive()
        stack.check_alive(exited_ok=["rollout-0"])


def test_a_component_runs_on_its_cpu_set_and_so_do_its_children():
    script = PARENT_WITH_CHILD.replace(
        'print("child"', 'import os; print("cpus", sorted(os.sched_getaffinity(0)))\nprint("child"'
    )
    with supervised(io.StringIO()) as stack:
        component = stack.start(ComponentSpec("pinned", [sys.executable, "-c", script], cpus=(0,)))
        child = _child_pid(component)
        assert "cpus [0]" in component.recent_output()
        assert os.sched_getaffinity(child) == {0}


def _restarted(stack, component) -> bool:
    stack.check_alive()  # restarts the component once its backoff has passed
    return component.running()


SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def test_a_killed_component_is_restarted_after_a_backoff_and_counted(tmp_path):
    policy = RestartPolicy("on-failure", backoff_s=0.3, max_backoff_s=1.0, limit=5, window_s=60)
    with supervised(io.StringIO(), policy) as stack:
        stack.restarts_file = tmp_path / "restarts.json"
        component = stack.start(ComponentSpec("queue", SLEEPER))
        first = component.process.pid
        os.kill(first, signal.SIGKILL)
        component.process.wait(timeout=10)
        stack.check_alive()  # schedules the restart, does not block on it
        assert not component.running()
        wait_until(lambda: _restarted(stack, component), 10, "the restart")
        assert component.process.pid != first and process_alive(component.process.pid)
        recorded = json.loads(stack.restarts_file.read_text())["queue"]
        assert recorded["restarts"] == 1 and recorded["last_exit_code"] == -signal.SIGKILL and recorded["running"]


def test_a_crash_looping_component_stops_the_stack_by_name(tmp_path):
    policy = RestartPolicy("on-failure", backoff_s=0.05, max_backoff_s=0.1, limit=2, window_s=60)
    # The first run outlives its start (a component that dies before it is ready fails the start
    # instead, which another test covers); every restart crashes at once.
    marker = tmp_path / "started-once"
    crash = [sys.executable, "-c", CRASHES_AFTER_FIRST_START, str(marker)]
    with pytest.raises(ComponentError) as err, supervised(io.StringIO(), policy) as stack:
        stack.start_all([ComponentSpec("paramsync", crash)])
        # check_alive returns nothing: it raises once the policy gives up on paramsync.
        wait_until(stack.check_alive, 30, "the stack to give up on paramsync", poll_s=0.02)
    assert str(err.value).startswith("paramsync: exited with code 4 after 2 restarts within 60s; giving up")
    assert stack.restarts["paramsync"].restarts == 2


def test_backoff_doubles_per_restart_in_the_window():
    policy = RestartPolicy("always", backoff_s=1.0, max_backoff_s=5.0, limit=10, window_s=100)
    record = RestartRecord()
    delays = []
    for now in (0.0, 1.0, 3.0, 7.0, 12.0):
        delays.append(record.schedule(policy, 1, now))
        record.restarted(now)
    assert delays == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_policy_never_stops_the_stack_and_always_restarts_a_clean_exit():
    with (
        pytest.raises(ComponentError, match="engine-0: exited with code -9"),
        supervised(io.StringIO(), RestartPolicy("never")) as stack,
    ):
        component = stack.start(ComponentSpec("engine-0", SLEEPER))
        component.kill()
        stack.check_alive()
    assert RestartPolicy("always").wants_restart(0)
    assert not RestartPolicy("on-failure").wants_restart(0) and RestartPolicy("on-failure").wants_restart(-9)


# torchrun starts each worker in a session of its own, outside the launcher's process group.
PARENT_WITH_OWN_SESSION_CHILD = PARENT_WITH_CHILD.replace('sleep(600)"])', 'sleep(600)"], start_new_session=True)')


def test_a_restart_first_kills_workers_that_left_the_process_group():
    assert "start_new_session" in PARENT_WITH_OWN_SESSION_CHILD
    policy = RestartPolicy("on-failure", backoff_s=0.1)
    with supervised(io.StringIO(), policy) as stack:
        component = stack.start(ComponentSpec("trainer", [sys.executable, "-c", PARENT_WITH_OWN_SESSION_CHILD]))
        orphan = _child_pid(component)
        os.kill(component.process.pid, signal.SIGKILL)  # the launcher alone dies; its worker lives on
        component.process.wait(timeout=10)
        assert process_alive(orphan)
        wait_until(lambda: _restarted(stack, component), 10, "the restart")
        assert not process_alive(orphan), "the old worker survived the restart (it would hold the ports)"
    assert not any(process_alive(pid) for pid in (orphan, component.process.pid))


# A stack with a Python service and a program, each in a session of its own as the local stack
# starts them, that then waits to be killed.
STACK = """
import sys, time
from commands.stack.process import ComponentSpec
from commands.stack.supervisor import supervised
service_argv = [sys.executable, "-m", "tests.integration.forkserver_child", "wait"]
with supervised(None) as stack:
    service = stack.start(ComponentSpec("service", service_argv))
    program = stack.start(ComponentSpec("program", ["sleep", "600"]))
    while '"preloaded"' not in service.recent_output():  # the service runs its own code
        time.sleep(0.05)
    print(service.process.pid, program.process.pid, type(service.process).__name__, flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("forked", [True, False], ids=["through-a-fork-server", "new-interpreters"])
def test_a_stack_killed_with_sigkill_takes_its_components_along(forked: bool) -> None:
    env = {k: v for k, v in os.environ.items() if k != FORKSERVER_VARIABLE}
    server = ForkServer() if forked else None
    if server is not None:
        env[FORKSERVER_VARIABLE] = str(server.path)
    stack = subprocess.Popen(
        [sys.executable, "-c", STACK], cwd=REPO, env={**env, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert stack.stdout is not None
        service, program, kind = stack.stdout.readline().split()
        assert kind == ("ForkedProcess" if forked else "Popen")
        assert process_alive(int(service)) and process_alive(int(program))
        stack.kill()
        stack.wait(timeout=30)
        for pid in (int(service), int(program)):
            wait_until(lambda p=pid: not process_alive(p), 20, f"component {pid} to end with its stack")
    finally:
        if stack.poll() is None:
            stack.kill()
        if server is not None:
            server.stop()
