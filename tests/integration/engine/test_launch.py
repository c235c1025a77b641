"""An engine a benchmark starts (``launch_engine``) ends with the benchmark, even one killed with
SIGKILL: on a GPU host an engine left behind keeps its share of the card from the next run."""

import os
import subprocess
import sys
from pathlib import Path

from tests.processes import process_alive
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[3]

BENCH = """
import sys, time
from pathlib import Path
from relayrl.net import free_port
from services.engine.launch import launch_engine, wait_engine_healthy

port = free_port()
engine = launch_engine(Path(sys.argv[1]), port)
wait_engine_healthy(engine, f"http://127.0.0.1:{port}", timeout_s=120)
print(engine.pid, flush=True)
time.sleep(600)
"""


def test_an_engine_ends_with_the_benchmark_that_started_it_even_one_killed(tiny_model_dir) -> None:
    bench = subprocess.Popen(
        [sys.executable, "-c", BENCH, str(tiny_model_dir)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert bench.stdout is not None
        engine = int(bench.stdout.readline())
        assert process_alive(engine)
        bench.kill()
        bench.wait(timeout=30)
        wait_until(lambda: not process_alive(engine), 30, "the engine to end with its benchmark")
    finally:
        if bench.poll() is None:
            bench.kill()
