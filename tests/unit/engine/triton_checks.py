"""The triton attention backend's checks, run by ``test_triton.py`` in a process of their own with
``TRITON_INTERPRET=1`` set before Triton is imported (Triton's own library functions are compiled
or interpreted as they are defined, at its import); with ``compile`` as argument (and no
interpreter), the decode kernel is compiled for a Hopper GPU (sm_90) without one, as the engine
launches it on Qwen2.5-0.5B's heads. Prints one line per check that passed."""

from __future__ import annotations

import os
import sys

import torch

from tests.unit.engine.models import random_causal_lm
from tests.unit.engine.test_attention import HEAD_DIM, HEADS, KV_HEADS, PAGE, check_against_dense
from tests.unit.engine.test_model_runner import Running, runner_of

CHECKS = [
    "decode equals dense attention",
    "prefill equals dense attention",
    "qwen head groups over several tiles equal dense attention",
    "rows split along their keys equal dense attention",
    "float16 rows split and not equal dense attention",
    "qwen2 runner equals lone passes",
    "llama runner equals lone passes",
    "a forked row continues as its original",
]
COMPILED = [
    "the decode kernel compiles for sm_90 with bfloat16 and float32",
    "the merge of split rows compiles for sm_90 with bfloat16 and float32",
]


def main() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    from services.engine import triton_attention

    torch.set_num_threads(1)
    for queries, check in ((1, CHECKS[0]), (3, CHECKS[1])):
        check_against_dense("triton", queries, [5, 11, 1 + queries], HEADS, KV_HEADS, HEAD_DIM, PAGE)
        print(check)
    # Qwen2.5-0.5B's heads (14 query heads in 2 groups of 7, 64 dims); rows shorter and longer than a 64-token tile.
    check_against_dense("triton", 1, [150, 64, 2, 65], heads=14, kv_heads=2, head_dim=64, page=16)
    print(CHECKS[2])
    # A few rows split along their keys (an H200 splits a step of 8 rows 16 ways): rows of 1 to 3
    # tiles leave most splits past their end, and a split of a row longer than the splits' tiles
    # takes more than one.
    for splits in (2, 3, triton_attention.MAX_SPLITS):
        check_against_dense("triton", 1, [150, 64, 2, 65, 600], 14, 2, 64, page=16, kv_splits=splits)
    print(CHECKS[3])
    # The engine's 16-bit path (its loads, dots and casts) on CUDA's 128-token pages; bfloat16's own
    # cannot run here (the interpreter's dot takes its bits for integers), the GPU tests check it.
    for splits in (1, triton_attention.MAX_SPLITS):
        check_against_dense("triton", 1, [300, 2, 129], 14, 2, 64, 128, kv_splits=splits, dtype=torch.float16)
    print(CHECKS[4])
    for arch, check in (("qwen2", CHECKS[5]), ("llama", CHECKS[6])):
        model = random_causal_lm(arch)
        running = Running(runner_of(model, "triton"))
        running.join([[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19]])
        running.assert_lone(model)
        for _ in range(6):
            running.step()
            running.assert_lone(model)
        print(check)
    running = Running(runner_of(model, "triton"))
    running.join([[3, 1, 4, 1, 5, 9, 2, 6]])
    running.slots.append(running.runner.kv.fork(running.slots[0]))
    running.ids.append(list(running.ids[0]))
    running.logits.append(running.logits[0])
    for _ in range(3):
        running.step()
        running.assert_lone(model)
    torch.testing.assert_close(running.logits[0], running.logits[1])
    print(CHECKS[7])


def compiled() -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from services.engine import triton_attention

    for dtype, precision in (("bf16", "tf32"), ("fp32", "ieee")):
        signature = {name: f"*{dtype}" for name in ("q_ptr", "k_ptr", "v_ptr", "out_ptr")}
        signature |= {"part_ptr": "*fp32", "lse_ptr": "*fp32", "tables_ptr": "*i64", "positions_ptr": "*i64"}
        strides = ("stride_qb", "stride_qh", "stride_qd", "stride_kh", "stride_kt", "stride_ob", "stride_oh")
        strides += ("stride_tb", "stride_pb", "stride_partb", "stride_parth", "stride_parts")
        signature |= {name: "i32" for name in ("splits", *strides, "stride_lseb", "stride_lseh")}
        signature |= {"scale": "fp32"}
        # Qwen2.5-0.5B: 14 query heads over 2 KV heads of 64 dimensions; CUDA's 128-token pages.
        constexprs = {"GROUP": 7, "BLOCK_H": 16, "HEAD_DIM": 64, "BLOCK_D": 64, "PAGE": 128}
        constexprs |= {"BLOCK_N": triton_attention.BLOCK_N, "PRECISION": precision}
        signature |= dict.fromkeys(constexprs, "constexpr")
        source = ASTSource(fn=triton_attention._paged_decode, signature=signature, constexprs=constexprs)
        assert triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["cubin"]
    print(COMPILED[0])
    for dtype in ("bf16", "fp32"):
        signature = {"part_ptr": "*fp32", "lse_ptr": "*fp32", "out_ptr": f"*{dtype}", "splits": "i32"}
        strides = ("stride_partb", "stride_parth", "stride_parts", "stride_lseb", "stride_lseh", "stride_ob")
        signature |= {name: "i32" for name in (*strides, "stride_oh")}
        constexprs = {"HEAD_DIM": 64, "BLOCK_D": 64, "BLOCK_S": triton_attention.MAX_SPLITS}
        signature |= dict.fromkeys(constexprs, "constexpr")
        source = ASTSource(fn=triton_attention._merge_splits, signature=signature, constexprs=constexprs)
        assert triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["cubin"]
    print(COMPILED[1])


if __name__ == "__main__":
    compiled() if sys.argv[1:] == ["compile"] else main()
