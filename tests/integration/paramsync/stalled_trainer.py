"""A trainer that uploads half of a version and then hangs, so a test can SIGKILL it mid-upload.

``python stalled_trainer.py ADDRESS VERSION [grpc|dataplane|streamed]``: prints ``HALF`` once half of
the bytes are sent, over the Publish RPC (default), over the bulk data plane, or as the trainer
does (``ParamSyncClient.publish_streamed``, its gather stalled after the first of two buckets).
"""

from __future__ import annotations

import asyncio
import socket
import sys

import torch

from relayrl.serving import grpc_channel
from relayrl.v1 import paramsync_pb2 as pb
from relayrl.v1 import paramsync_pb2_grpc as pb_grpc
from services.paramsync.channels.dataplane import frame, recv_frame
from services.paramsync.client import ParamSyncClient
from services.paramsync.tensors import as_pairs, build_manifest, open_specs, raw_bytes

CHUNK = 1024


async def main(address: str, version: int, path: str) -> None:
    pairs = as_pairs({"w": torch.full((4096,), float(version))})
    manifest = build_manifest(version, pairs, 0, "sha256")
    data = raw_bytes(pairs[0][1])
    if path == "streamed":
        second = ("w2", torch.full((4096,), -float(version)))

        async def buckets():
            yield [pairs[0][1]]
            print("HALF", flush=True)  # asked for the second bucket: the first one is sent
            await asyncio.Event().wait()

        async with ParamSyncClient(address) as client:
            await client.publish_streamed(version, open_specs([*pairs, second]), buckets())
    if path == "dataplane":
        async with grpc_channel(address) as channel:
            port = (await pb_grpc.ParamSyncStub(channel).DataPlane(pb.DataPlaneRequest())).data_port
        with socket.create_connection((address.rpartition(":")[0], port)) as sock:
            sock.sendall(frame(pb.BulkRequest(publish=manifest.to_proto())))
            assert recv_frame(sock, pb.BulkReply).code == 0
            sock.sendall(data[: data.nbytes // 2])
            print("HALF", flush=True)
            await asyncio.Event().wait()
    half_sent = asyncio.Event()

    async def messages():
        yield pb.WeightStreamMessage(manifest=manifest.to_proto())
        for offset in range(0, data.nbytes // 2, CHUNK):
            yield pb.WeightStreamMessage(
                chunk=pb.WeightChunk(tensor_name="w", offset=offset, data=bytes(data[offset : offset + CHUNK]))
            )
        half_sent.set()
        await asyncio.Event().wait()

    async with grpc_channel(address) as channel:
        call = asyncio.ensure_future(pb_grpc.ParamSyncStub(channel).Publish(messages()))
        await half_sent.wait()
        print("HALF", flush=True)
        await call


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "grpc"))
