"""Hand-framed chunks are byte-identical to protobuf's, and decode back without loss."""

import os

import pytest
from google.protobuf.message import DecodeError

from relayrl.v1 import paramsync_pb2 as pb
from services.paramsync.wire import RawChunk, decode_stream_message, encode_chunk


@pytest.mark.parametrize(
    ("name", "offset", "data"),
    [("a.b", 0, b""), ("x", 5, os.urandom(300)), ("", 0, b"z"), ("w" * 200, 2**40, os.urandom(70_000))],
)
def test_chunks_match_protobuf_byte_for_byte_and_round_trip(name, offset, data):
    framed = encode_chunk(name, offset, memoryview(data))
    assert (
        framed
        == pb.WeightStreamMessage(chunk=pb.WeightChunk(tensor_name=name, offset=offset, data=data)).SerializeToString()
    )
    decoded = decode_stream_message(framed)
    assert isinstance(decoded, RawChunk) and (decoded.tensor_name, decoded.offset, bytes(decoded.data)) == (
        name,
        offset,
        data,
    )


def test_anything_but_a_plain_chunk_goes_through_protobuf():
    manifest = pb.WeightStreamMessage(manifest=pb.WeightManifest(version=3, total_bytes=8))
    assert decode_stream_message(manifest.SerializeToString()) == manifest
    truncated = encode_chunk("w", 0, b"abcdef")[:-2]
    with pytest.raises(DecodeError):
        decode_stream_message(truncated)
