#!/usr/bin/env bash
# Installs Triton into a folder of its own (.venv/triton) for the tests of the engine's Triton kernels:
# they run them in Triton's interpreter and compile them for sm_90 (tests/unit/engine/triton_runs.py).
#
# The wheel unpacks to about 1 GB, and CI's disk has run out on it (Errno 28, halfway through setup).
# Those tests need libtriton, the Python package, its backends' Python (Triton's entry points import
# the AMD one too) and the NVIDIA compiler for sm_90 (ptxas-blackwell, which Triton runs from sm_90 on,
# and libdevice). What serves only other GPUs or Triton's profiler goes, about 440 MB: the AMD code
# generator's libraries, ptxas for GPUs before sm_90, cuobjdump, nvdisasm, CUPTI and libproton. No pip
# cache, so the wheel is not kept twice.
set -euo pipefail

VERSION="3.9.0"
DEST="${1:-.venv/triton}"
PIP="${PIP:-.venv/bin/pip}"
STAMP="$DEST/.source"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "triton==$VERSION" ]]; then
  exit 0
fi
rm -rf "$DEST"
"$PIP" install --quiet --disable-pip-version-check --no-cache-dir --target "$DEST" "triton==$VERSION"
nvidia="$DEST/triton/backends/nvidia"
rm -rf "$DEST/triton/backends/amd/lib" "$nvidia"/bin/{ptxas,cuobjdump,nvdisasm} "$nvidia"/lib/cupti* \
  "$DEST/triton/_C/libproton.so"
echo "triton==$VERSION" > "$STAMP"
