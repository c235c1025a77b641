"""Validating a serialized ``TrajectoryGroup`` from its wire bytes, without building the message.

:func:`relayrl.schema.validate_group` is the definition of a well-formed group, but it needs
the parsed message, and a parse plus a per-trajectory numpy pass costs ~0.4 ms for a group of
8 × 1024 tokens, the largest part of a push. Here the same rules run on the packed fields as
they arrive: the payload is parsed into a *view* of ``TrajectoryGroup`` whose token ids,
log-probs and token rewards are declared ``repeated bytes`` (the same wire encoding, so the
parser still checks every tag, length, string and nested message), and numpy checks those
bytes for the whole group at once: log-probs as float32, token ids by counting varint ends.

The fast path only ever says "well formed" or "look closer". Anything unusual (a parse error,
a field encoded unpacked, unknown fields, a token id of 2**28 or more, any failed rule) goes
to the slow path: the real parse and ``validate_group``, whose messages are the ones
reported. A group the fast path accepts is one ``validate_group`` accepts;
``tests/unit/queue/test_groupcheck.py`` holds them to that, including over corrupted bytes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, unknown_fields
from google.protobuf.message import DecodeError

from relayrl.schema import validate_group
from relayrl.v1 import trajectory_pb2 as pb

_VIEW_PACKAGE = "relayrl.queue.view"
# Left packed as bytes in the view: parsing them into Python containers is what costs.
_RAW_FIELDS = ("prompt_token_ids", "response_token_ids", "behavior_logprobs", "token_rewards")


@dataclass(frozen=True, slots=True)
class GroupHeader:
    """What the stream entry's header fields say about a valid group."""

    group_id: str
    min_policy_version: int
    max_policy_version: int
    samples: int
    response_tokens: int
    created_at_unix_s: float
    is_eval: bool


@dataclass(frozen=True, slots=True)
class Inspection:
    """A group's header when it is well formed, otherwise every problem ``validate_group`` names."""

    header: GroupHeader | None
    problems: list[str]


def _view_class() -> type:
    """``TrajectoryGroup`` from trajectory.proto with its packed scalar fields read as raw bytes."""
    file = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(file)
    file.name = "relayrl/queue/trajectory_view.proto"
    file.package = _VIEW_PACKAGE
    messages = [*file.message_type, *(n for m in file.message_type for n in m.nested_type)]
    for message in messages:
        for f in message.field:
            if f.type_name:
                f.type_name = f.type_name.replace(".relayrl.v1.", f".{_VIEW_PACKAGE}.")
            if message.name == "Trajectory" and f.name in _RAW_FIELDS:
                f.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
                f.ClearField("options")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_VIEW_PACKAGE}.TrajectoryGroup"))


_GroupView = _view_class()


def inspect_group(payload: bytes) -> Inspection:
    """Validates one serialized group by the rules of ``validate_group``."""
    header = _fast_header(payload)
    return Inspection(header, []) if header is not None else _slow_inspection(payload)


def _slow_inspection(payload: bytes) -> Inspection:
    msg = pb.TrajectoryGroup()
    try:
        msg.ParseFromString(payload)
    except DecodeError as err:
        return Inspection(None, [f"does not decode as a TrajectoryGroup: {err}"])
    problems = validate_group(msg)
    if problems:
        return Inspection(None, problems)
    header = GroupHeader(
        group_id=msg.group_id,
        min_policy_version=msg.min_policy_version,
        max_policy_version=msg.max_policy_version,
        samples=len(msg.trajectories),
        response_tokens=sum(len(t.response_token_ids) for t in msg.trajectories),
        created_at_unix_s=msg.created_at_unix_s,
        is_eval=msg.is_eval,
    )
    return Inspection(header, [])


def _fast_header(payload: bytes) -> GroupHeader | None:
    """The header of a group that passes every rule on its packed bytes; None: look closer."""
    view = _GroupView()
    try:
        view.ParseFromString(payload)
    except DecodeError:
        return None
    trajectories = view.trajectories
    if not view.group_id or not trajectories or unknown_fields.UnknownFieldSet(view):
        return None
    if view.extra_info_json and not _json_object(view.extra_info_json):
        return None
    id_parts: list[bytes] = []
    logprob_parts: list[bytes] = []
    versions: list[np.ndarray] = []
    # Per trajectory: how many packed parts its prompt and response ids came in, and its length.
    layout: list[tuple[int, int, int]] = []
    for t in trajectories:
        if unknown_fields.UnknownFieldSet(t) or not t.prompt_token_ids or not math.isfinite(t.reward):
            return None
        n_logprobs = _floats(t.behavior_logprobs)
        n_rewards = _floats(t.token_rewards)
        n = len(t.policy_versions)
        if n_logprobs != n or n_rewards not in (0, n):
            return None
        layout.append((len(t.prompt_token_ids), len(t.response_token_ids), n))
        id_parts.extend(t.prompt_token_ids)
        id_parts.extend(t.response_token_ids)
        logprob_parts.extend(t.behavior_logprobs)
        if n:
            versions.append(np.asarray(t.policy_versions, dtype=np.int64))
    if not versions:
        return None
    counts = _small_varint_counts(id_parts)
    if counts is None:
        return None
    part = response_tokens = 0
    for n_prompt_parts, n_response_parts, n in layout:
        n_prompt = int(counts[part : part + n_prompt_parts].sum())
        part += n_prompt_parts
        n_response = int(counts[part : part + n_response_parts].sum())
        part += n_response_parts
        if n_prompt == 0 or n_response != n:
            return None
        response_tokens += n_response
    all_versions = np.concatenate(versions)
    low, high = int(all_versions.min()), int(all_versions.max())
    if low < 0 or (view.min_policy_version, view.max_policy_version) != (low, high):
        return None
    logprobs = np.frombuffer(b"".join(logprob_parts), dtype="<f4")
    if not (np.isfinite(logprobs).all() and (logprobs <= 0).all()):
        return None
    return GroupHeader(
        group_id=view.group_id,
        min_policy_version=low,
        max_policy_version=high,
        samples=len(trajectories),
        response_tokens=response_tokens,
        created_at_unix_s=view.created_at_unix_s,
        is_eval=view.is_eval,
    )


def _floats(parts: Sequence[bytes]) -> int:
    """How many float32 values packed ``parts`` hold; -1 when one is not a whole number of them."""
    total = 0
    for p in parts:
        if len(p) % 4:
            return -1
        total += len(p)
    return total // 4


def _json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


def _small_varint_counts(parts: list[bytes]) -> np.ndarray | None:
    """How many varints each packed int32 part holds, or None unless all are 0 <= value < 2**28.

    A varint ends on its first byte below 0x80, so counting those counts values. Vocabulary
    ids need at most 3 bytes; a varint of 5 or more bytes (a negative id is 10) sends the
    group to the slow path, as does an empty part or one that ends inside a varint.
    """
    sizes = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
    if not sizes.all():
        return None
    data = np.frombuffer(b"".join(parts), dtype=np.uint8)
    continues = data >= 0x80
    bounds = np.cumsum(sizes)
    if continues[bounds - 1].any():
        return None
    if (continues[:-3] & continues[1:-2] & continues[2:-1] & continues[3:]).any():
        return None
    return np.add.reduceat(~continues, bounds - sizes, dtype=np.int64)
