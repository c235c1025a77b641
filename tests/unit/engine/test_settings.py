from __future__ import annotations

import os

import pytest
import torch

from relayrl.config import SettingsError, load_settings
from services.engine.config import EngineSettings


def test_torch_threads_default_to_the_cpus_this_process_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RELAYRL_ENGINE_TORCH_THREADS", raising=False)
    settings = load_settings(EngineSettings)
    assert settings.torch_threads == 0
    assert settings.resolved_torch_threads() == len(os.sched_getaffinity(0))


def test_an_explicit_torch_thread_count_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAYRL_ENGINE_TORCH_THREADS", "3")
    assert load_settings(EngineSettings).resolved_torch_threads() == 3


def test_a_negative_torch_thread_count_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAYRL_ENGINE_TORCH_THREADS", "-1")
    with pytest.raises(SettingsError, match="RELAYRL_ENGINE_TORCH_THREADS"):
        load_settings(EngineSettings)


def test_cuda_without_a_gpu_stops_at_start_naming_the_device_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from relayrl.devices import cuda_unavailable_reason

    if cuda_unavailable_reason() is None:
        pytest.skip("this machine has a GPU")
    monkeypatch.setenv("RELAYRL_ENGINE_DEVICE", "cuda")
    with pytest.raises(SettingsError, match="RELAYRL_ENGINE_DEVICE") as err:
        load_settings(EngineSettings)
    assert "\n" not in err.value.one_line()


def test_auto_settings_resolve_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = load_settings(EngineSettings)
    assert (settings.resolved_dtype(), settings.resolved_page_size(), settings.resolved_attention_backend()) == (
        "float32",
        16,
        "torch_native",
    )
    on_gpu = settings.model_copy(update={"device": "cuda"})  # not validated: the resolution alone
    assert (on_gpu.resolved_dtype(), on_gpu.resolved_page_size(), on_gpu.resolved_attention_backend()) == (
        "bfloat16",
        128,
        "flex_attention",
    )
    assert (settings.resolved_sampling_backend(), on_gpu.resolved_sampling_backend()) == ("pytorch", "triton")


def test_the_triton_sampler_outside_cuda_and_the_interpreter_is_refused_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from services.engine.sampling import sampler_named

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(SettingsError) as err:
        sampler_named("triton", torch.device("cpu"))
    assert "RELAYRL_ENGINE_SAMPLING_BACKEND=triton" in err.value.one_line()
    assert sampler_named("pytorch", torch.device("cpu")).name == "pytorch"


def test_an_unknown_attention_backend_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAYRL_ENGINE_ATTENTION_BACKEND", "flashinfer")
    with pytest.raises(SettingsError, match="RELAYRL_ENGINE_ATTENTION_BACKEND"):
        load_settings(EngineSettings)


def test_graphs_are_captured_only_up_to_the_largest_decode_batch_there_can_be() -> None:
    from services.engine.device import graph_batch_sizes

    settings = load_settings(EngineSettings).model_copy(update={"max_running_requests": 20, "cuda_graph_max_bs": 256})
    assert graph_batch_sizes(settings.resolved_cuda_graph_max_bs()) == [1, 2, 4, 8, 16, 20]
    smaller = settings.model_copy(update={"cuda_graph_max_bs": 8})
    assert smaller.resolved_cuda_graph_max_bs() == 8


def test_versions_are_served_from_their_files_only_on_cpu(tmp_path) -> None:
    settings = load_settings(EngineSettings).model_copy(update={"shared_weights_dir": str(tmp_path)})
    assert settings.resolved_shared_weights_dir() == str(tmp_path)
    on_gpu = settings.model_copy(update={"device": "cuda"})  # not validated: the resolution alone
    assert on_gpu.resolved_shared_weights_dir() == ""
