"""Where a step's time went (`relayrl.profiling`): the device's busy time counts overlapping kernels
once, kernels are grouped by what a reader looks for (matmul, attention, collectives), a real
profiled pass on this CPU names its matrix products, and torch.compile's graphs and seconds are
counted."""

from __future__ import annotations

import torch

from relayrl.profiling import Span, busy_seconds, compile_summary, kind_of, profile, summarize


def test_busy_time_counts_overlapping_kernels_once_and_leaves_the_gaps_out() -> None:
    # Two streams overlap over [10, 20) µs; nothing runs in [30, 40).
    spans = [Span("a", 0, 20), Span("b", 10, 20), Span("c", 40, 10)]

    assert busy_seconds(spans) == 40e-6


def test_kernels_are_grouped_by_what_they_do() -> None:
    assert (
        kind_of("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>")
        == "matmul"
    )
    assert kind_of("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN") == "matmul"
    assert kind_of("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == "collective"
    assert kind_of("triton_tem_fused_0") == "attention"
    assert kind_of("_paged_decode") == "attention"
    assert kind_of("triton_per_fused__log_softmax_0") == "compiled"
    assert kind_of("Memcpy HtoD (Pinned -> Device)") == "copy"
    assert kind_of("void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel>") == "other"


def test_the_summary_ranks_names_by_time_and_gives_the_gpus_busy_share() -> None:
    spans = [Span("gemm_a", 0, 600), Span("gemm_a", 700, 200), Span("flash_fwd", 900, 100)]

    summary = summarize(spans, wall_s=2e-3, device="cuda", top=1)

    assert summary["top"] == [{"name": "gemm_a", "kind": "matmul", "s": 0.0008, "calls": 2}]
    assert summary["by_kind"] == {"matmul": 0.0008, "attention": 0.0001}
    assert summary["busy_s"] == 0.0009 and summary["busy_share"] == 0.45


def test_a_profiled_pass_on_the_cpu_names_its_matrix_products() -> None:
    a, b = torch.randn(256, 256), torch.randn(256, 256)

    value, summary = profile(lambda: (a @ b).relu().sum(), torch.device("cpu"))

    assert torch.isclose(value, (a @ b).relu().sum())
    assert summary["device"] == "cpu" and summary["busy_share"] is None
    assert summary["by_kind"]["matmul"] > 0 and summary["top"][0]["kind"] == "matmul"
    assert 0 < summary["total_s"] <= summary["wall_s"] * torch.get_num_threads() + 1e-3


def test_the_compile_summary_counts_a_new_graph_and_its_seconds() -> None:
    before = compile_summary()

    # The eager backend: dynamo traces the function (a graph, its seconds) and builds no kernel.
    compiled = torch.compile(lambda x: torch.sin(x) * 2 + x, backend="eager", fullgraph=True)
    assert torch.allclose(compiled(torch.ones(4)), torch.sin(torch.ones(4)) * 2 + 1)

    after = compile_summary()
    assert after["graphs"] == before["graphs"] + 1 and after["seconds"] > before["seconds"]
    assert after["kernels_s"] == before["kernels_s"]
