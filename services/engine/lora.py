"""LoRA adapters served next to the base weights, as SGLang serves them (``/load_lora_adapter``,
``/unload_lora_adapter``, ``lora_path`` on ``/generate``).

An adapter is a directory in peft's format (:mod:`relayrl.models.adapters`).

The adapter is applied in the forward pass, never merged: each targeted linear layer gets a
forward hook that adds ``scale · (x Aᵀ) Bᵀ`` (scale = alpha / r) to the rows of the batch whose
request named that adapter. Merging would need a copy of every targeted weight per adapter (a
second model at real size), and one batch mixes requests of several adapters and of the base
(the previous version's requests finish while the next one's start), which a merged copy cannot
serve. Hooks leave the model's parameter names alone, so full weight updates still apply.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from relayrl.devices import upload
from relayrl.models.adapters import CONFIG_FILE, PEFT_PREFIX, WEIGHTS_FILE


@dataclass(eq=False)  # identity: the scheduler groups rows by the adapter object
class LoraAdapter:
    """One loaded adapter: per targeted module, A [r, in] and B [out, r] in the model's dtype."""

    name: str
    path: str
    scale: float
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]]
    # Sequences (running or waiting) that name it; an unloaded adapter is dropped at zero.
    users: int = 0
    unloaded: bool = False


def _scale(config: dict[str, Any]) -> float:
    rank, alpha = int(config["r"]), float(config.get("lora_alpha", config["r"]))
    if config.get("use_dora"):
        raise ValueError("DoRA adapters are not supported")
    # peft's rsLoRA scaling is alpha / sqrt(r); plain LoRA's is alpha / r.
    return alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank


def read_adapter(name: str, path: str | Path, model: torch.nn.Module) -> LoraAdapter:
    """Reads a peft adapter directory and checks every tensor against ``model``; ValueError if not loadable."""
    directory = Path(path)
    try:
        config = json.loads((directory / CONFIG_FILE).read_text())
        tensors = load_file(str(directory / WEIGHTS_FILE))
        scale = _scale(config)
    except (OSError, ValueError, KeyError, TypeError, SafetensorError) as exc:
        raise ValueError(f"{directory} is not a peft LoRA adapter: {exc}") from exc
    modules = dict(model.named_modules())
    dtype = next(model.parameters()).dtype
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for tensor_name, tensor in tensors.items():
        stem, _, kind = tensor_name.removeprefix(PEFT_PREFIX).removesuffix(".weight").rpartition(".")
        if kind not in ("lora_A", "lora_B"):
            raise ValueError(f"{tensor_name}: not a LoRA tensor (only lora_A/lora_B weights are supported)")
        # A copy: the file may be a received version's mapping, which the next version overwrites.
        pairs.setdefault(stem, {})[kind] = tensor.to(dtype, copy=True)
    weights = {}
    for module_name, pair in pairs.items():
        module = modules.get(module_name)
        if not isinstance(module, torch.nn.Linear):
            raise ValueError(f"{module_name}: no linear layer of that name in the model")
        if pair.keys() != {"lora_A", "lora_B"}:
            raise ValueError(f"{module_name}: needs both lora_A and lora_B")
        a, b = pair["lora_A"], pair["lora_B"]
        if a.shape[1] != module.in_features or b.shape[0] != module.out_features or a.shape[0] != b.shape[1]:
            raise ValueError(
                f"{module_name}: lora_A {tuple(a.shape)} / lora_B {tuple(b.shape)} do not fit"
                f" [{module.out_features}, {module.in_features}]"
            )
        weights[module_name] = (a, b)
    if not weights:
        raise ValueError(f"{directory} holds no LoRA tensors")
    return LoraAdapter(name, str(path), scale, weights)


@dataclass
class LoraSet:
    """The adapters an engine holds, and which one each row of the current forward pass uses."""

    model: torch.nn.Module
    adapters: dict[str, LoraAdapter] = field(default_factory=dict)
    _hooked: set[str] = field(default_factory=set)
    # The adapters of the batch being forwarded, each with its rows' indices on the model's device.
    _groups: list[tuple[LoraAdapter, torch.Tensor]] = field(default_factory=list)

    def load(self, adapter: LoraAdapter) -> None:
        current = self.adapters.get(adapter.name)
        if current is not None and not current.unloaded:
            raise ValueError(f"LoRA adapter {adapter.name!r} is already loaded")
        modules = dict(self.model.named_modules())
        for module_name in adapter.weights.keys() - self._hooked:
            modules[module_name].register_forward_hook(self._hook(module_name))
            self._hooked.add(module_name)
        self.adapters[adapter.name] = adapter

    def unload(self, name: str) -> None:
        """New requests can no longer name it; requests already using it finish with it (as in SGLang)."""
        adapter = self.adapters.get(name)
        if adapter is None or adapter.unloaded:
            raise ValueError(f"LoRA adapter {name!r} is not loaded")
        adapter.unloaded = True
        self._drop_if_unused(adapter)

    def acquire(self, name: str | None) -> LoraAdapter | None:
        """The adapter a new request names (None: the base); ValueError for one that is not loaded."""
        if name is None:
            return None
        adapter = self.adapters.get(name)
        if adapter is None or adapter.unloaded:
            raise ValueError(f"LoRA adapter {name!r} is not loaded; loaded: {self.loaded()}")
        adapter.users += 1
        return adapter

    def release(self, adapter: LoraAdapter | None) -> None:
        if adapter is not None:
            adapter.users -= 1
            self._drop_if_unused(adapter)

    def loaded(self) -> dict[str, str]:
        """SGLang's ``loaded_adapters``: name → path."""
        # A snapshot: the HTTP thread reads it while the scheduler thread may change the dict.
        return {a.name: a.path for a in list(self.adapters.values()) if not a.unloaded}

    @contextlib.contextmanager
    def rows(self, adapters: Sequence[LoraAdapter | None]) -> Iterator[None]:
        """Within it, each row of the batch being forwarded uses ``adapters[row]`` (None: the base).
        An adapter's row indices go to the device once a pass, not once a hooked layer."""
        groups: dict[int, tuple[LoraAdapter, list[int]]] = {}
        for row, adapter in enumerate(adapters):
            if adapter is not None:
                groups.setdefault(id(adapter), (adapter, []))[1].append(row)
        if groups:
            device = next(self.model.parameters()).device
            self._groups = [(adapter, upload(torch.tensor(rows), device)) for adapter, rows in groups.values()]
        try:
            yield
        finally:
            self._groups = []

    def _drop_if_unused(self, adapter: LoraAdapter) -> None:
        if adapter.unloaded and adapter.users <= 0 and self.adapters.get(adapter.name) is adapter:
            del self.adapters[adapter.name]

    def _hook(self, module_name: str):
        def add_lora(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
            x_BLI = inputs[0]
            for adapter, index in self._groups:
                if module_name not in adapter.weights:
                    continue
                a, b = adapter.weights[module_name]
                delta_BLO = (x_BLI.index_select(0, index) @ a.T) @ b.T
                output = output.index_add(0, index, delta_BLO, alpha=adapter.scale)
            return output

        return add_lora
