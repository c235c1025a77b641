"""Process supervision: readiness, failures named by component, and no orphans."""

import io
import os
import sys
import time

import pytest

from relayrl.stack.process import ComponentError, ComponentSpec
from relayrl.stack.supervisor import supervised
from tests.processes import process_alive

# A parent that starts a long-lived child, as torchrun does with its workers.
PARENT_WITH_CHILD = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print("child", child.pid, flush=True)
time.sleep(600)
"""


def _child_pid(component) -> int:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for line in component.recent_output().splitlines():
            if line.startswith("child "):
                return int(line.split()[1])
        time.sleep(0.05)
    raise AssertionError("child never reported its pid")


def test_stopping_the_stack_leaves_no_process_behind():
    sink = io.StringIO()
    with supervised(sink) as stack:
        component = stack.start(ComponentSpec("worker", [sys.executable, "-c", PARENT_WITH_CHILD]))
        child = _child_pid(component)
        parent = component.process.pid
        assert process_alive(child)
    assert not process_alive(parent) and not process_alive(child)
    assert "[worker] child" in sink.getvalue()


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
