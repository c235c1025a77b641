"""Mixed precision as users expect it (FSDP2's MixedPrecisionPolicy, verl's param_dtype bf16): the
blocks compute in bf16 while the master weights, the gradients the optimizer steps with and the
optimizer's state stay fp32."""

import torch

from tests.integration.trainer.harness import run_logged, torchrun


def test_bf16_compute_keeps_fp32_master_weights_gradients_and_optimizer_state(tiny_model_dir, tmp_path):
    out = tmp_path / "dtypes.pt"
    cmd = torchrun(2, "tests.integration.trainer.mixed_precision_worker", str(tiny_model_dir), str(out))
    run_logged(cmd, tmp_path / "worker.log")
    seen = torch.load(out, weights_only=False)
    assert seen["compute"] == ["torch.bfloat16"]
    assert seen["grads"] == ["torch.float32"]
    assert seen["weights"] == ["torch.float32"]
    assert seen["optimizer_tensors"] > 0 and seen["optimizer_state"] == ["torch.float32"]
