#!/usr/bin/env bash
# Installs RelayRL from a bundle (`make bundle`) with no network and no root:
#
#   scripts/install-offline.sh BUNDLE [VENV]
#
# BUNDLE is the bundle directory or its .tar.gz; VENV (default ./.venv) is created with
# --system-site-packages, so it sees the host's own torch (and whatever else the host has in range);
# pip installs only from the bundle's wheels and never replaces a host package in place.
# redis-server goes to VENV/bin/redis-server (a wrapper that finds the bundled libraries), where the
# local stack looks first. PYTHON picks the interpreter (default python3).
set -euo pipefail

die() { echo "install-offline: $*" >&2; exit 1; }

[[ $# -ge 1 && $# -le 2 ]] || die "usage: scripts/install-offline.sh BUNDLE [VENV]"
BUNDLE="$1"
VENV="${2:-.venv}"
PYTHON="${PYTHON:-python3}"

command -v "$PYTHON" >/dev/null || die "no $PYTHON on PATH; set PYTHON to the host's Python"
if [[ -f "$BUNDLE" ]]; then
  unpacked="$(mktemp -d)"
  trap 'rm -rf "$unpacked"' EXIT
  tar -xzf "$BUNDLE" -C "$unpacked"
  BUNDLE="$(find "$unpacked" -mindepth 2 -maxdepth 2 -name manifest.json -printf '%h\n' | head -n 1)"
fi
[[ -f "$BUNDLE/manifest.json" ]] || die "$1 is not a bundle (no manifest.json); build one with make bundle"
BUNDLE="$(cd "$BUNDLE" && pwd)"

# The bundle's Python, platform and glibc against this host's, before anything is written.
"$PYTHON" - "$BUNDLE/manifest.json" <<'PY' || exit 1
import json, os, platform, sys

m = json.load(open(sys.argv[1]))
found = f"{sys.version_info[0]}.{sys.version_info[1]}"
if m["python"] != found:
    sys.exit(f"install-offline: this bundle is for Python {m['python']} ({m['python_tag']}) but "
             f"{sys.executable} is Python {found}; build one with make bundle PY={found}")
if platform.machine() != "x86_64":
    sys.exit(f"install-offline: this bundle is for {m['platform']} but this machine is {platform.machine()}")
libc, version = platform.libc_ver()
need = m["redis"].get("glibc_required", "2.17")
if libc != "glibc" or tuple(map(int, version.split("."))) < tuple(map(int, need.split("."))):
    sys.exit(f"install-offline: the bundled redis-server needs glibc >= {need}, this host has {libc} {version}")
PY

# What the bundle leaves to the host (torch, numpy...) must be here, in range: one line per shortfall.
"$PYTHON" - "$BUNDLE/manifest.json" <<'PY' || exit 1
import json, sys
from importlib.metadata import PackageNotFoundError, version

try:
    from pip._vendor.packaging.requirements import Requirement
except ImportError:  # no pip on the host: its packaging is vendored nowhere else for sure
    sys.exit("install-offline: the host's Python has no pip; install one (python -m ensurepip)")

m = json.load(open(sys.argv[1]))
short = []
for line in m["host_requirements"]:
    req = Requirement(line)
    try:
        have = version(req.name)
    except PackageNotFoundError:
        have = None
    if have is None or not req.specifier.contains(have, prereleases=True):
        short.append(f"{req.name}{req.specifier} (found {have or 'none'})")
if short:
    sys.exit(f"install-offline: the host must bring what this bundle leaves out: {'; '.join(short)}")
PY

torch_version() { "$1" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "absent"; }
TORCH_BEFORE="$(torch_version "$PYTHON")"
echo "install-offline: torch before: $TORCH_BEFORE"

# No pip of its own unless it needs one: the host's pip (seen through the system site) installs into the
# venv as well, and bootstrapping another copy is most of a venv's creation time.
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv --system-site-packages --without-pip "$VENV"
VENV="$(cd "$VENV" && pwd)"
# --system-site-packages shows the base interpreter's packages; where PYTHON is itself a venv (the
# host's torch installed in it), a .pth file adds that venv's site directories (after the new venv's own).
"$PYTHON" - > "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/relayrl-host-site.pth" <<'PY'
import site, sys
if sys.prefix != sys.base_prefix:
    for path in site.getsitepackages():
        print(f"import site; site.addsitedir({path!r})")
PY

"$VENV/bin/python" -m pip --version >/dev/null 2>&1 || "$VENV/bin/python" -m ensurepip --default-pip >/dev/null

# No index, no config files (a host's pip.conf may name an index or constraints): the bundle alone.
read -r -a WANT < <("$VENV/bin/python" -c 'import json,sys; print(" ".join(json.load(open(sys.argv[1]))["install"]))' "$BUNDLE/manifest.json")
PIP_CONFIG_FILE=/dev/null "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
  --no-index --find-links "$BUNDLE/wheels" "${WANT[@]}"
# RelayRL itself into the venv, whatever the host's site shows: a copy of the same version there (an
# earlier install, an editable checkout) satisfies pip above, and the venv would then run that copy
# and have no `relayrl` command of its own.
read -r -a PROJECT < <("$VENV/bin/python" -c 'import json,sys; print(" ".join(json.load(open(sys.argv[1])).get("project", [])))' "$BUNDLE/manifest.json")
if [[ ${#PROJECT[@]} -gt 0 ]]; then
  PIP_CONFIG_FILE=/dev/null "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    --no-index --find-links "$BUNDLE/wheels" --no-deps --force-reinstall "${PROJECT[@]}"
fi

# redis-server: the binary and its libraries under VENV/lib/relayrl-redis, a wrapper on VENV/bin.
REDIS_HOME="$VENV/lib/relayrl-redis"
rm -rf "$REDIS_HOME"
mkdir -p "$REDIS_HOME"
cp -a "$BUNDLE/redis/bin/redis-server" "$BUNDLE/redis/lib" "$REDIS_HOME/"
cat > "$VENV/bin/redis-server" <<'SH'
#!/bin/sh
# RelayRL's bundled redis-server (scripts/install-offline.sh): Debian's build with its own libraries.
home="$(dirname "$(readlink -f "$0")")/../lib/relayrl-redis"
LD_LIBRARY_PATH="$home/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH
exec "$home/redis-server" "$@"
SH
chmod +x "$VENV/bin/redis-server"
"$VENV/bin/redis-server" --version >/dev/null || die "the bundled redis-server does not run here: $("$VENV/bin/redis-server" --version 2>&1 | head -n 1)"

TORCH_AFTER="$(torch_version "$VENV/bin/python")"
echo "install-offline: torch after: $TORCH_AFTER"
[[ "$TORCH_AFTER" == "$TORCH_BEFORE" ]] || die "torch changed from $TORCH_BEFORE to $TORCH_AFTER"
echo "install-offline: $("$VENV/bin/redis-server" --version | cut -d' ' -f1-3) at $VENV/bin/redis-server"
if [[ -x "$VENV/bin/relayrl" ]]; then
  echo "install-offline: relayrl $("$VENV/bin/relayrl" --version) in $VENV"
fi
