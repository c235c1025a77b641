"""A process holding the receiving end of the ``torch_dist`` channel behind SGLang's three
weight-update-group calls, as an engine does, minus the model: each tensor it receives is
written raw to ``<out_dir>/<name>`` for the test to compare. Args: port out_dir."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI

from services.paramsync.channels.torch_dist import TorchDistReceiver


def app(out_dir: Path) -> FastAPI:
    api = FastAPI()
    receiver = TorchDistReceiver()

    def answer(call: Any, *args: Any) -> dict[str, Any]:
        try:
            call(*args)
        except (ValueError, RuntimeError) as exc:
            return {"success": False, "message": str(exc)}
        return {"success": True, "message": ""}

    def receive_and_write(body: dict[str, Any]) -> None:
        tensors = receiver.receive(body["group_name"], body["names"], body["dtypes"], body["shapes"])
        for name, tensor in tensors.items():
            (out_dir / name).write_bytes(bytes(tensor.contiguous().view(-1).view(torch.uint8).numpy()))

    @api.get("/health")
    async def health() -> dict[str, bool]:
        return {"ok": True}

    @api.post("/init_weights_update_group")
    async def init(body: dict[str, Any]) -> dict[str, Any]:
        keys = ("master_address", "master_port", "rank_offset", "world_size", "group_name", "backend")
        return await asyncio.to_thread(answer, receiver.init_group, *(body[k] for k in keys))

    @api.post("/update_weights_from_distributed")
    async def update(body: dict[str, Any]) -> dict[str, Any]:
        return await asyncio.to_thread(answer, receive_and_write, body)

    @api.post("/destroy_weights_update_group")
    async def destroy(body: dict[str, Any]) -> dict[str, Any]:
        return await asyncio.to_thread(answer, receiver.destroy, body["group_name"])

    return api


if __name__ == "__main__":
    uvicorn.run(app(Path(sys.argv[2])), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
