#!/usr/bin/env bash
# Every GPU check of issues #46, #47, #49 and #50 in one command, within one time budget:
#
#   OUT=/some/folder bash scripts/gpu-checks/session.sh [STAGE[=SECONDS] ...]
#
# The stages, their order and budgets are in stages.py; what lands under $OUT, the settings and how
# the lead runs it on the device machine are in README.md beside this file. GPU_CHECKS_DRY=1 prints
# each stage's commands and budget and runs nothing. PYTHON picks the host's Python (default python3).
set -euo pipefail
cd "$(dirname "$0")/../.."
exec "${PYTHON:-python3}" scripts/gpu-checks/session.py "$@"
