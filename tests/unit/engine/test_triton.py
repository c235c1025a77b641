"""The triton attention backend on a CPU, in Triton's interpreter: its kernel equals dense SDPA
(float32, tight tolerance) for decode steps, over pages out of order, with Qwen2.5-0.5B's head
groups, rows longer than a tile and rows split along their keys, in float32 and float16 (the
interpreter cannot take bfloat16's dot; the GPU tests do), and the model runner over it gives
every row the logits of a lone forward pass; and the decode kernel and the merge of split rows
compile for a Hopper GPU (sm_90) as the engine launches them on Qwen2.5-0.5B's heads. The checks
run in a process of their own (``triton_checks.py``): the interpreter must be on before Triton is
imported, and on in no other process (an engine started by another test inherits the
environment). Skipped where Triton 3.8 or later is not installed (an older interpreter cannot run
a loop bounded by a loaded value under NumPy 2.4)."""

from __future__ import annotations

import pytest

from tests.unit.engine.triton_checks import CHECKS, COMPILED
from tests.unit.engine.triton_runs import run_checks, triton_version


def test_the_triton_backend_in_tritons_interpreter_equals_dense_attention_and_lone_passes() -> None:
    version = triton_version()
    if version is None or version < (3, 8):
        pytest.skip(f"Triton 3.8 or later is not installed (found {version}; make setup installs it)")
    assert run_checks("tests.unit.engine.triton_checks", interpret=True) == CHECKS


def test_the_triton_decode_kernel_compiles_for_hopper() -> None:
    if triton_version() is None:
        pytest.skip("Triton is not installed (make setup installs it)")
    assert run_checks("tests.unit.engine.triton_checks", "compile", interpret=False) == COMPILED
