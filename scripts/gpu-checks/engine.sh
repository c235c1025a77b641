#!/usr/bin/env bash
# The built-in engine's GPU checks (issue #47) as one script for a GPU session: the engine's
# gpu-marked tests, then `relayrl bench engine --device cuda --preset base --json`, with each
# attention backend (flex_attention, the CUDA default, then torch_native) so the faster can be kept.
# Everything it produces lands under $OUT (a temporary folder when OUT is unset):
#   gpu.txt                       the GPU's name and memory (nvidia-smi)
#   engine-gpu-tests.txt / .xml   pytest's output and its JUnit report
#   bench-engine-base.json        the bench's one JSON line (flex_attention, CUDA graphs on)
#   bench-engine-base-native.json the same with torch_native (no graphs: its gather's width changes per step)
#   *.err                         each command's stderr
# Budget (15 minutes of device time, the machine's start included): at most 4 minutes of tests,
# 6 of the bench (its floors on the first 64 requests: HF generate alone takes minutes on all 256)
# and 3 of the torch_native engine run; TESTS_TIMEOUT_S, BENCH_TIMEOUT_S, NATIVE_TIMEOUT_S override. Run from anywhere: `bash scripts/gpu-checks/engine.sh`.
set -uo pipefail

source "$(dirname "$0")/common.sh"

timeout "${TESTS_TIMEOUT_S:-240}" "$PYTHON" -m pytest -m gpu -n 0 -q -rfE tests/gpu/engine \
    --junitxml="$OUT/engine-gpu-tests.xml" >"$OUT/engine-gpu-tests.txt" 2>&1
tests_rc=$?

bench() {  # seconds, name, then extra options
    local seconds=$1 name=$2
    shift 2
    timeout "$seconds" "$PYTHON" -m commands.cli bench engine --device cuda --preset base --json "$@" \
        >"$OUT/$name.json" 2>"$OUT/$name.err"
}
bench "${BENCH_TIMEOUT_S:-360}" bench-engine-base --floor-requests 64
bench_rc=$?
bench "${NATIVE_TIMEOUT_S:-180}" bench-engine-base-native --attention-backend torch_native --no-floors
native_rc=$?

echo "tests rc=$tests_rc bench rc=$bench_rc native bench rc=$native_rc" | tee "$OUT/summary.txt"
tail -5 "$OUT/engine-gpu-tests.txt"
cat "$OUT"/bench-engine-base*.json
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
