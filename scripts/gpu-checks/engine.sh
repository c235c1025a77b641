#!/usr/bin/env bash
# The built-in engine's GPU checks (issue #47) alone: session.sh's install, the engine's gpu tests,
# then `relayrl bench engine --device cuda --preset base --json` with the default attention backend
# (flex_attention, CUDA graphs) and with the other candidates, torch_native and triton. Results under
# $OUT as session.sh writes them (README.md).
GPU_CHECKS_TESTS=tests/gpu/engine exec "$(dirname "$0")/session.sh" install tests engine engine-backends
