"""A fork server: one process that has imported torch and transformers once, and forks each Python
service from there instead of starting a new interpreter that imports them again.

Importing torch and transformers costs about 7 s of CPU per process on our CI's cores, most of a
small engine's or trainer's start, and a local stack (or the test suite, which starts hundreds of
them) pays it in every one. ``python -m relayrl.forkserver SOCKET`` imports them with the
collector off, freezes that heap out of every later collection, and then serves one request per
connection on the Unix socket ``SOCKET``: run ``python -m MODULE ARGS`` with this environment,
working directory, standard streams and CPUs. It forks; the child applies all of that and runs
the module as ``python -m`` would, in a session of its own when asked; the server answers the
child's pid, then its exit status when it ends (the child is the server's to reap). A child asked
to end with its caller gets SIGTERM (its whole session, when it has one) once the requester's
connection closes with the child still running, which happens when the requester dies; and once
the server itself is gone (:mod:`relayrl.lifeline`).

Where ``RELAYRL_FORKSERVER`` names a socket, :func:`relayrl.subprocesses.start_process` starts
Python services through it; anything it cannot start exactly as a new interpreter would (another
interpreter, a ``PYTHON*``, ``HF_*``, ``TRANSFORMERS_*`` or ``TORCH*`` variable that differs from
the server's, since those are read when the libraries are imported) starts as a new interpreter.
On a host with an NVIDIA GPU it forks nothing (:func:`usable`): an import that asks the driver
about devices would leave a CUDA state that no forked child can use.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from relayrl import lifeline

ENV_VARIABLE = "RELAYRL_FORKSERVER"
# Read by the interpreter or by the preloaded libraries when they are imported: a child whose value
# differs from the server's would not get what a new interpreter gets, so it starts as one.
_IMPORT_TIME_PREFIXES = ("PYTHON", "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TORCH", "PYTORCH_", "TOKENIZERS_")
# Harmless to differ: how the child's output is buffered, where its imports are looked for (the
# preloaded libraries were found before either) and the Hub's offline mode (which our loads set
# and huggingface_hub reads into one constant at import), all three applied in the child; and the
# inductor's cache directory, read when used (torch sets it in its own process on first use).
_APPLIED_HERE = frozenset(
    {"PYTHONUNBUFFERED", "PYTHONPATH", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TORCHINDUCTOR_CACHE_DIR"}
)
PRELOAD = (
    "torch",
    "torch.distributed.fsdp",
    "transformers",
    "transformers.models.qwen2.modeling_qwen2",
    "transformers.models.llama.modeling_llama",
    "safetensors.torch",
    "numpy",
    "pydantic",
    "pydantic_settings",
    "fastapi",
    "uvicorn",
    "grpc",
    "grpc.aio",
    "google.protobuf",
    "redis.asyncio",
    "httpx",
    "prometheus_client",
    "typer",
    "yaml",
)
_MAX_REQUEST = 1 << 20
# The server's environment before its imports (which may set variables of their own).
_STARTED_WITH = dict(os.environ)


@dataclass(frozen=True)
class Request:
    """What a new interpreter would be given: ``python -m module *args`` in ``cwd`` with ``env``."""

    executable: str
    module: str
    args: list[str]
    env: dict[str, str]
    cwd: str
    new_session: bool
    cpus: list[int] | None
    end_with_caller: bool = False


@dataclass(frozen=True)
class _Child:
    pid: int
    conn: socket.socket  # the requester's connection: the exit status goes back on it
    request: Request


def usable() -> bool:
    """Whether forking services is safe here: not on a host with an NVIDIA GPU, where an import that
    asks the driver about devices would leave a CUDA state the children cannot use."""
    return not Path("/dev/nvidiactl").exists()


def import_time_mismatch(env: Mapping[str, str], server_env: Mapping[str, str]) -> str | None:
    """The first variable read at import time whose value differs between ``env`` and the server's."""
    names = {n for n in (*env, *server_env) if n.startswith(_IMPORT_TIME_PREFIXES) and n not in _APPLIED_HERE}
    for name in sorted(names):
        if env.get(name) != server_env.get(name):
            return name
    return None


# The server.


def serve(path: Path) -> Request | None:
    """Serves until SIGTERM; returns (in a forked child only) the request that child must run."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(64)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    stopping = os.pipe()
    server = os.getpid()

    def on_sigterm(*_: object) -> None:
        if os.getpid() == server:
            os.write(stopping[1], b"x")
            return
        # A child forked a moment ago, still before its own handler: the server ended it (its
        # requester went). Writing to the pipe it shares with the server would stop the server.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)
    selector.register(stopping[0], selectors.EVENT_READ, "stop")
    # Serves no longer than the process that started it (a stack killed with SIGKILL leaves none).
    parent = os.pidfd_open(os.getppid())
    selector.register(parent, selectors.EVENT_READ, "stop")
    children: dict[int, _Child] = {}  # by pidfd
    print(f"forkserver ready on {path}", flush=True)
    while True:
        for key, _ in selector.select():
            if key.data == "stop":
                listener.close()
                return None
            if key.data == "accept":
                conn, _ = listener.accept()
                forked = _fork_one(conn, selector, listener, children)
                if forked is not None:
                    for fd in (*stopping, parent):
                        os.close(fd)
                    return forked
                continue
            if isinstance(key.data, _Child):
                _caller_spoke(selector, key.data)
                continue
            child = children.pop(key.fd)
            selector.unregister(key.fd)
            os.close(key.fd)
            _, status = os.waitpid(child.pid, 0)
            if child.conn in selector.get_map():  # the caller is still watched
                selector.unregister(child.conn)
            with contextlib.suppress(OSError):
                child.conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            child.conn.close()


def _caller_spoke(selector: selectors.BaseSelector, child: _Child) -> None:
    """The requester of a child that ends with its caller never writes after its request: its
    connection turning readable means it closed, so the requester is gone, and the child goes too."""
    if child.conn.fileno() == -1:  # the child ended in the same round, and its status was answered
        return
    try:
        if child.conn.recv(1):
            return
    except BlockingIOError:
        return
    except OSError:
        pass
    selector.unregister(child.conn)
    with contextlib.suppress(ProcessLookupError):
        if child.request.new_session:
            os.killpg(child.pid, signal.SIGTERM)
        else:
            os.kill(child.pid, signal.SIGTERM)


def _fork_one(
    conn: socket.socket,
    selector: selectors.BaseSelector,
    listener: socket.socket,
    children: dict[int, _Child],
) -> Request | None:
    fds: list[int] = []
    try:
        conn.settimeout(10.0)
        data, fds, _, _ = socket.recv_fds(conn, _MAX_REQUEST, 3)
        while not data.endswith(b"\n"):
            more = conn.recv(_MAX_REQUEST)
            if not more:
                raise ConnectionError("request cut short")
            data += more
        request = Request(**json.loads(data))
        if len(fds) != 3:
            raise ValueError(f"expected 3 descriptors, got {len(fds)}")
        if not usable():
            raise ValueError("this host has an NVIDIA GPU: services start as new interpreters")
        if request.executable != sys.executable:
            raise ValueError(f"this server runs {sys.executable}, not {request.executable}")
        differs = import_time_mismatch(request.env, _STARTED_WITH)
        if differs is not None:
            raise ValueError(f"{differs} differs from this server's, and is read when libraries are imported")
    except (OSError, ValueError, TypeError) as exc:
        _refuse(conn, fds, str(exc))
        return None
    server = os.getpid()
    try:
        pid = os.fork()
    except OSError as exc:  # out of processes or memory: the caller starts a new interpreter
        _refuse(conn, fds, f"fork failed: {exc}")
        return None
    if pid == 0:
        selector.close()
        listener.close()
        for pidfd, other in children.items():
            os.close(pidfd)
            other.conn.close()
        _become(request, fds, conn, server)
        return request
    for fd in fds:
        os.close(fd)
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    conn.setblocking(False)
    pidfd = os.pidfd_open(pid)
    child = _Child(pid, conn, request)
    children[pidfd] = child
    selector.register(pidfd, selectors.EVENT_READ, "child")
    if request.end_with_caller:
        selector.register(conn, selectors.EVENT_READ, child)
    return None


def _refuse(conn: socket.socket, fds: list[int], reason: str) -> None:
    """Answers a request it will not run with ``reason`` (its caller starts a new interpreter)."""
    for fd in fds:
        os.close(fd)
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps({"error": reason}).encode() + b"\n")
    conn.close()


def _become(request: Request, fds: list[int], conn: socket.socket, server: int) -> None:
    """In the child: the state a new interpreter started with this request would have."""
    conn.close()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if request.new_session:
        os.setsid()
    if request.end_with_caller:
        lifeline.end_with_parent(server)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)
    if request.cpus:
        os.sched_setaffinity(0, request.cpus)
    unbuffered = bool(request.env.get("PYTHONUNBUFFERED"))
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True, write_through=unbuffered)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True, write_through=True)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    # A new interpreter's path: the working directory (as `python -m` puts it), PYTHONPATH, then
    # the standard library and site-packages.
    ours = [p for p in _STARTED_WITH.get("PYTHONPATH", "").split(os.pathsep) if p]
    base = [p for p in sys.path[1:] if p not in ours]
    sys.path[:] = [request.cwd, *(p for p in request.env.get("PYTHONPATH", "").split(os.pathsep) if p), *base]
    sys.argv = [request.module, *request.args]
    hub = sys.modules.get("huggingface_hub.constants")
    if hub is not None:
        offline = request.env.get("HF_HUB_OFFLINE") or request.env.get("TRANSFORMERS_OFFLINE") or ""
        hub.HF_HUB_OFFLINE = offline.upper() in {"1", "ON", "YES", "TRUE"}
    threads = request.env.get("OMP_NUM_THREADS")
    if threads and threads.isdigit() and "torch" in sys.modules:
        # The OpenMP runtime read the server's value when torch was imported.
        sys.modules["torch"].set_num_threads(int(threads))


def _run(request: Request) -> None:
    import runpy

    runpy.run_module(request.module, run_name="__main__", alter_sys=True)


def main(argv: Sequence[str]) -> None:
    if len(argv) != 1:
        raise SystemExit("usage: python -m relayrl.forkserver SOCKET")
    gc.disable()
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            __import__(name)
    gc.freeze()
    gc.enable()
    request = serve(Path(argv[0]))
    if request is not None:
        _run(request)


# The client.


class ForkedProcess:
    """A process the fork server started, handled as a ``subprocess.Popen``: ``pid``,
    ``returncode``, ``poll``, ``wait``, ``send_signal``, ``terminate``, ``kill`` and the pipes asked for."""

    def __init__(self, args: list[str], conn: socket.socket, pid: int, stdout: IO | None, stderr: IO | None) -> None:
        self.args = args
        self.pid = pid
        self.stdin = None
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None
        self._conn = conn
        self._buffer = b""
        self._orphaned = False
        # One reader of the status at a time (a supervisor polls while a stop waits, as with Popen).
        self._reading = threading.Lock()

    def _read_status(self, timeout: float | None) -> None:
        if self.returncode is not None:
            return
        if self._orphaned:
            self.returncode = _gone_returncode(self.pid)
            return
        self._conn.settimeout(timeout)
        try:
            while not self._buffer.endswith(b"\n"):
                chunk = self._conn.recv(4096)
                if not chunk:
                    # The server is gone and took the exit status with it; the pid is no longer ours to wait on.
                    self._orphaned = True
                    self._conn.close()
                    self.returncode = _gone_returncode(self.pid)
                    return
                self._buffer += chunk
        except (TimeoutError, BlockingIOError):
            return
        self.returncode = int(json.loads(self._buffer)["returncode"])
        self._conn.close()

    def poll(self) -> int | None:
        if self._reading.acquire(blocking=False):
            try:
                self._read_status(0.0)
            finally:
                self._reading.release()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            if self._reading.acquire(timeout=-1 if left is None else left):
                try:
                    self._read_status(left)
                finally:
                    self._reading.release()
            if self.returncode is not None:
                return self.returncode
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            if self._orphaned:
                time.sleep(0.05)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _gone_returncode(pid: int) -> int | None:
    """For a child whose server died: None while it still runs, else -SIGKILL (its status is lost)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return -signal.SIGKILL
    return -signal.SIGKILL if state == "Z" else None


def spawn(
    path: str,
    module: str,
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | os.PathLike[str] | None,
    stdin: Any,
    stdout: Any,
    stderr: Any,
    text: bool,
    new_session: bool,
    cpus: Sequence[int] | None,
    end_with_caller: bool = False,
) -> ForkedProcess:
    """Asks the server at ``path`` to run ``python -m module args``; the streams take what Popen's
    do (None, ``subprocess.DEVNULL``, ``PIPE``, ``STDOUT`` for stderr, a file or a descriptor).
    Raises OSError where the server cannot be reached or refuses."""
    opened: list[int] = []
    ours: dict[str, int] = {}

    def descriptor(stream: Any, name: str, default: int) -> int:
        if stream is None:
            return default
        if stream == subprocess.DEVNULL:
            fd = os.open(os.devnull, os.O_RDWR)
            opened.append(fd)
            return fd
        if stream == subprocess.PIPE:
            read, write = os.pipe()
            ours[name] = read
            opened.append(write)
            return write
        return stream if isinstance(stream, int) else stream.fileno()

    try:
        fds = [descriptor(stdin, "stdin", 0), descriptor(stdout, "stdout", 1)]
        fds.append(fds[1] if stderr == subprocess.STDOUT else descriptor(stderr, "stderr", 2))
        request = Request(
            executable=sys.executable,
            module=module,
            args=list(args),
            env=dict(env),
            cwd=str(Path(cwd or os.getcwd()).resolve()),
            new_session=new_session,
            # A new process inherits its parent's CPUs: the server's are not the requester's.
            cpus=list(cpus) if cpus else sorted(os.sched_getaffinity(0)),
            end_with_caller=end_with_caller,
        )
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.settimeout(30.0)
            conn.connect(path)
            socket.send_fds(conn, [json.dumps(request.__dict__).encode() + b"\n"], fds)
            answer = b""
            while not answer.endswith(b"\n"):
                chunk = conn.recv(4096)
                if not chunk:
                    raise ConnectionError(f"the fork server at {path} closed the connection")
                answer += chunk
        except BaseException:
            conn.close()
            raise
    except BaseException:
        for fd in ours.values():
            os.close(fd)
        raise
    finally:
        for fd in opened:
            os.close(fd)
    reply = json.loads(answer)
    if "pid" not in reply:
        conn.close()
        raise OSError(f"the fork server refused: {reply.get('error')}")

    def wrap(name: str) -> IO | None:
        if name not in ours:
            return None
        return open(ours[name], "r" if text else "rb", buffering=1 if text else -1)

    return ForkedProcess([sys.executable, "-m", module, *args], conn, int(reply["pid"]), wrap("stdout"), wrap("stderr"))


class ForkServer:
    """A fork server of this interpreter, started with this process's environment and stopped with
    :meth:`stop`. Its socket is ``path``, in a directory of its own under the temporary directory:
    a Unix socket's path holds at most 107 bytes, which a run directory may not leave. With
    ``wait``, returns once it serves; without, at once (until it serves, :func:`spawn` fails to
    connect and its callers start new interpreters)."""

    def __init__(self, wait: bool = True, ready_timeout_s: float = 120.0) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="relayrl-fs-")) / "socket"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "relayrl.forkserver", str(self.path)],
            env={k: v for k, v in os.environ.items() if k != ENV_VARIABLE},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._ready_timeout_s = ready_timeout_s
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Returns once the server serves; raises RuntimeError if it exited, TimeoutError if it is slow."""
        deadline = time.monotonic() + self._ready_timeout_s
        while not self._answers():
            if self.process.poll() is not None:
                raise RuntimeError(f"the fork server exited with {self.process.returncode} before it served")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the fork server at {self.path} did not serve within {self._ready_timeout_s:.0f}s")
            time.sleep(0.05)

    def _answers(self) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(self.path))
            except OSError:
                return False
        return True

    def stop(self) -> None:
        """Stops serving and removes its socket; children it started run on (each is stopped by
        whoever asked for it). Stopping again does nothing."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.path.parent, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
