"""The offline install path of a GPU host, proven on this CPU machine.

A small bundle is built by ``scripts/bundle.py`` exactly as ``make bundle`` builds the real one (pip's
resolution for the target Python, the wheels, redis-server and its libraries unpacked from Debian's
packages), with one pure-Python wheel in place of RelayRL's dependencies. ``scripts/install-offline.sh``
then installs it with the network namespace empty (``unshare -n``: no route anywhere), from this
venv's Python as the "host" Python, whose torch must come through untouched.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"
PROBE = "relayrl_bundle_probe"


def _why_not() -> str | None:
    for tool in ("apt-get", "dpkg-deb", "dpkg", "ldd", "redis-server", "unshare"):
        if shutil.which(tool) is None:
            return f"needs {tool} (a Debian machine with redis-server installed)"
    if subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode != 0:
        return "unshare -n is not permitted here (needs root or user namespaces)"
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")


def _probe_wheel(tmp: Path, answer: str = "from the bundle") -> Path:
    """A pure wheel standing in for RelayRL's: a module that says where it came from, and a command."""
    src = tmp / "probe"
    (src / PROBE).mkdir(parents=True)
    (src / PROBE / "__init__.py").write_text(f"ANSWER = {answer!r}\n\ndef main():\n    print(ANSWER)\n")
    (src / "pyproject.toml").write_text(
        textwrap.dedent(f"""\
            [build-system]
            requires = ["setuptools"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "{PROBE}"
            version = "1.0"

            [project.scripts]
            {PROBE} = "{PROBE}:main"
            """)
    )
    out = tmp / "wheel"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
    )
    return next(out.glob("*.whl"))


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("bundle")
    cmd = [sys.executable, str(REPO / "scripts/bundle.py"), "--python", PYTHON, "--out", str(tmp / "small")]
    cmd += ["--wheel", str(_probe_wheel(tmp)), "--budget-mib", "0"]
    if any(Path("/var/lib/apt/lists").glob("*_Packages*")):
        cmd.append("--no-apt-update")  # the lists make setup fetched will do; only root may refresh them
    built = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr[-2000:]
    sizes = json.loads(built.stdout.strip().splitlines()[-1])
    assert sizes["wheels"] == 1
    return Path(sizes["tarball"])


def _install(bundle: Path, venv: Path, *, offline: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = ["unshare", "-n"] if offline else []
    cmd += [str(REPO / "scripts/install-offline.sh"), str(bundle), str(venv)]
    # This venv's Python plays the host's: it has torch, which the install must leave as it is.
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


def _ping(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(b"PING\r\n")
        return conn.recv(64)


def test_a_bundle_installs_with_no_network_and_keeps_the_hosts_torch(bundle: Path, tmp_path: Path) -> None:
    import torch

    venv = tmp_path / "venv"
    done = _install(bundle, venv)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"torch before: {torch.__version__}" in done.stdout
    assert f"torch after: {torch.__version__}" in done.stdout

    # The pure wheel is installed into the new venv, not merely visible from elsewhere.
    probe = subprocess.run(
        [str(venv / "bin/python"), "-c", f"import {PROBE}; print({PROBE}.ANSWER, {PROBE}.__file__, sep='|')"],
        capture_output=True,
        text=True,
    )
    assert probe.returncode == 0, probe.stderr
    answer, where = probe.stdout.strip().split("|")
    assert answer == "from the bundle"
    assert where.startswith(str(venv)), where

    # RelayRL's own lookup, run from the new venv (not activated), picks the bundled redis-server,
    # which starts with its Debian libraries and answers.
    script = textwrap.dedent("""\
        import sys, tempfile
        from pathlib import Path
        from relayrl.redis_process import RedisProcess
        redis = RedisProcess(Path(tempfile.mkdtemp())).start()
        print(redis.command()[0], redis.port, flush=True)
        sys.stdin.readline()
        redis.stop()
        """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with subprocess.Popen(
        [str(venv / "bin/python"), "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    ) as server:
        assert server.stdout is not None and server.stdin is not None
        binary, port = server.stdout.readline().split()
        try:
            assert binary == str(venv / "bin/redis-server")
            assert _ping(int(port)) == b"+PONG\r\n"
        finally:
            server.stdin.write("\n")
            server.stdin.flush()
        assert server.wait(timeout=15) == 0


def test_the_bundles_own_wheel_lands_in_the_venv_though_the_host_shows_the_same_version(
    bundle: Path, tmp_path: Path
) -> None:
    # A host whose site already holds the project at the bundle's version (an earlier install, an
    # editable checkout): pip would take it as installed, and the venv would run the host's copy and
    # have no command of its own.
    host = tmp_path / "host"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(host)], check=True)
    site = subprocess.run(
        [str(host / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    hosts_copy = _probe_wheel(tmp_path / "hosts-copy", answer="from the host")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site, str(hosts_copy)],
        check=True,
        capture_output=True,
    )
    venv = tmp_path / "venv"
    done = subprocess.run(
        ["unshare", "-n", str(REPO / "scripts/install-offline.sh"), str(bundle), str(venv)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": str(host / "bin/python")},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    command = subprocess.run([str(venv / f"bin/{PROBE}")], capture_output=True, text=True)
    assert (command.returncode, command.stdout.strip()) == (0, "from the bundle")


def test_a_bundle_for_another_python_stops_at_once_naming_both(bundle: Path, tmp_path: Path) -> None:
    with tarfile.open(bundle) as tar:
        tar.extractall(tmp_path, filter="data")
    (unpacked,) = tmp_path.iterdir()
    manifest = json.loads((unpacked / "manifest.json").read_text())
    manifest.update(python="3.9", python_tag="cp39")
    (unpacked / "manifest.json").write_text(json.dumps(manifest))

    venv = tmp_path / "venv"
    done = _install(unpacked, venv, offline=False)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "for Python 3.9 (cp39)" in lines[0] and f"is Python {PYTHON}" in lines[0]
    assert not venv.exists()
