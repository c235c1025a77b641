"""Packing by default only where it pays: flex_attention's document mask skips the blocks between a
packed row's sequences on CUDA, while sdpa on a CPU attends through a dense mask as long as the row
squared, so short samples trained several times slower packed than padded."""

from services.trainer.config import TrainerSettings


def test_packing_is_on_by_default_on_cuda_and_off_on_cpu() -> None:
    assert TrainerSettings(device="cpu").resolved_use_remove_padding is False
    assert TrainerSettings.model_construct(device="cuda", use_remove_padding=None).resolved_use_remove_padding is True


def test_an_explicit_choice_holds_on_either_device() -> None:
    assert TrainerSettings(device="cpu", use_remove_padding=True).resolved_use_remove_padding is True
    assert TrainerSettings.model_construct(device="cuda", use_remove_padding=False).resolved_use_remove_padding is False
