import pytest
from google.protobuf.internal.encoder import _VarintBytes

from relayrl.varint import decode_varint, encode_varint


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 2**31, 2**63 - 1])
def test_varints_are_protobufs_own_and_read_back(value):
    assert encode_varint(value) == _VarintBytes(value)
    assert decode_varint(b"\xff" + encode_varint(value), 1) == (value, 1 + len(_VarintBytes(value)))


def test_a_negative_int64_is_written_in_ten_bytes_of_twos_complement():
    encoded = encode_varint(-1)
    assert len(encoded) == 10 and decode_varint(encoded, 0) == (2**64 - 1, 10)


@pytest.mark.parametrize("data", [b"", b"\x80", b"\xff" * 11], ids=["empty", "cut off", "over 64 bits"])
def test_a_broken_varint_is_a_value_error(data):
    with pytest.raises(ValueError, match="truncated or overlong varint"):
        decode_varint(memoryview(data), 0)
