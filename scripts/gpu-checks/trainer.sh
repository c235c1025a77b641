#!/usr/bin/env bash
# The trainer's GPU checks (issue #46) alone: session.sh's install, the trainer's gpu tests, then
# `relayrl bench trainer --device cuda --preset base --workload realistic --json` with the defaults
# and with each of verl's switches flipped. Results under $OUT as session.sh writes them (README.md).
GPU_CHECKS_TESTS=tests/gpu/trainer exec "$(dirname "$0")/session.sh" \
    install tests=300 trainer trainer-switches trainer-batch
