"""The wire contract: every message survives a round trip, and the stubs match protos/."""

from pathlib import Path

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from relayrl import protogen
from relayrl.v1 import paramsync_pb2, queue_pb2, rollout_pb2, trajectory_pb2

MODULES = [trajectory_pb2, queue_pb2, paramsync_pb2, rollout_pb2]

_SCALARS = {
    FieldDescriptor.TYPE_DOUBLE: 1.5,
    FieldDescriptor.TYPE_FLOAT: -0.25,
    FieldDescriptor.TYPE_INT64: 1 << 40,
    FieldDescriptor.TYPE_INT32: -7,
    FieldDescriptor.TYPE_BOOL: True,
    FieldDescriptor.TYPE_STRING: "ünïcode",
    FieldDescriptor.TYPE_BYTES: b"\x00\xffchunk",
}


def _fill(message: Message, depth: int = 0) -> Message:
    """Sets every field (each oneof's first member) to a non-default value."""
    seen_oneofs = set()
    for field in message.DESCRIPTOR.fields:
        if field.containing_oneof is not None:
            if field.containing_oneof.name in seen_oneofs:
                continue
            seen_oneofs.add(field.containing_oneof.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            container = getattr(message, field.name)
            if value_field.message_type is None:
                container["k"] = _SCALARS[value_field.type]
            else:
                _fill(container["k"], depth + 1)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if depth > 4:
                continue
            if field.is_repeated:
                _fill(getattr(message, field.name).add(), depth + 1)
            else:
                _fill(getattr(message, field.name), depth + 1)
        elif field.type == FieldDescriptor.TYPE_ENUM:
            value = field.enum_type.values[-1].number
            if field.is_repeated:
                getattr(message, field.name).append(value)
            else:
                setattr(message, field.name, value)
        elif field.is_repeated:
            getattr(message, field.name).extend([_SCALARS[field.type]] * 2)
        else:
            setattr(message, field.name, _SCALARS[field.type])
    return message


def _all_messages() -> list[Descriptor]:
    return [desc for module in MODULES for desc in module.DESCRIPTOR.message_types_by_name.values()]


@pytest.mark.parametrize("descriptor", _all_messages(), ids=lambda d: d.full_name)
def test_every_message_round_trips(descriptor):
    cls = next(getattr(m, descriptor.name) for m in MODULES if descriptor.name in m.DESCRIPTOR.message_types_by_name)
    original = _fill(cls())
    assert original.ByteSize() > 0 or not descriptor.fields
    decoded = cls.FromString(original.SerializeToString())
    assert decoded == original
    for field in descriptor.fields:
        if field.containing_oneof is None and not field.is_repeated and field.message_type is None:
            assert getattr(decoded, field.name) == getattr(original, field.name)


def test_every_service_is_defined_once():
    services = {s for m in MODULES for s in m.DESCRIPTOR.services_by_name}
    assert services == {"TrajectoryQueue", "PromptQueue", "ParamSync", "RolloutControl"}


def test_committed_stubs_match_a_fresh_generation(tmp_path: Path):
    protogen.generate(tmp_path)
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.py*"))
    assert generated, "protoc generated nothing"
    stale = [str(rel) for rel in generated if (protogen.REPO_ROOT / rel).read_bytes() != (tmp_path / rel).read_bytes()]
    assert not stale, f"stubs differ from protos/, run `make proto`: {stale}"
    committed = sorted(p.relative_to(protogen.REPO_ROOT) for p in (protogen.REPO_ROOT / "relayrl/v1").glob("*_pb2*"))
    assert committed == generated, "relayrl/v1 holds stubs for protos that no longer exist"
