#!/usr/bin/env bash
# The trainer's GPU checks (issue #46) as one script for a GPU session: the trainer's gpu-marked tests,
# then `relayrl bench trainer --device cuda --preset base --workload realistic --json` (one GPU, FSDP2
# against the plain model side by side), then the same bench with each of verl's switches flipped.
# Everything it produces lands under $OUT (a temporary folder when OUT is unset):
#   gpu.txt                            the GPU's name and memory (nvidia-smi), torch and transformers
#   trainer-gpu-tests.txt / .xml       pytest's output and its JUnit report
#   bench-trainer-base.json            the bench's JSON line: defaults (packed, no checkpointing, eager)
#   bench-trainer-base-padded.json     use_remove_padding off
#   bench-trainer-base-ckpt.json       enable_gradient_checkpointing on
#   bench-trainer-base-compile.json    use_torch_compile on
#   bench-trainer-base-32k.json        ppo_max_token_len_per_gpu 32768 (the default bench uses 16384)
#   *.err                              each command's stderr
# Budget (15 minutes of device time, the machine's start included): at most 5 minutes of tests, 3 of the
# default bench and 1.5 of each switch's run (without the plain-model baseline, which the default run
# measures); TESTS_TIMEOUT_S, BENCH_TIMEOUT_S and SWITCH_TIMEOUT_S override. The targets are read from
# bench-trainer-base.json: perf/mfu/actor >= 0.25, fsdp_over_single >= 0.95, memory_allocated_gb_by_step
# flat. Run from anywhere: `bash scripts/gpu-checks/trainer.sh`.
set -uo pipefail

source "$(dirname "$0")/common.sh"

timeout "${TESTS_TIMEOUT_S:-300}" "$PYTHON" -m pytest -m gpu -n 0 -q -rfE tests/gpu/trainer \
    --junitxml="$OUT/trainer-gpu-tests.xml" >"$OUT/trainer-gpu-tests.txt" 2>&1
tests_rc=$?

bench() {  # seconds, name, then extra options
    local seconds=$1 name=$2
    shift 2
    timeout "$seconds" "$PYTHON" -m commands.cli bench trainer --device cuda --preset base --workload realistic \
        --json "$@" >"$OUT/$name.json" 2>"$OUT/$name.err"
}
bench "${BENCH_TIMEOUT_S:-180}" bench-trainer-base
bench_rc=$?
switch=${SWITCH_TIMEOUT_S:-90}
bench "$switch" bench-trainer-base-padded --no-use-remove-padding --no-single-process --steps 3
bench "$switch" bench-trainer-base-ckpt --enable-gradient-checkpointing --no-single-process --steps 3
bench "$switch" bench-trainer-base-compile --use-torch-compile --no-single-process --steps 3
bench "$switch" bench-trainer-base-32k --micro-batch-tokens 32768 --no-single-process --steps 3

echo "tests rc=$tests_rc bench rc=$bench_rc" | tee "$OUT/summary.txt"
tail -5 "$OUT/trainer-gpu-tests.txt"
cat "$OUT"/bench-trainer-base*.json
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
