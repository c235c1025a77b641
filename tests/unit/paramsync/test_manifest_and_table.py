"""Manifest validation, tensor round trips, the version table's states and the settings' replica list."""

import time

import pytest
import torch

from relayrl.config import load_settings
from relayrl.v1 import paramsync_pb2 as pb
from services.paramsync.config import ParamSyncSettings, parse_static_replicas
from services.paramsync.manifest import Manifest, TensorSpec, WeightHandles, _numel_up_to
from services.paramsync.metrics import ParamSyncMetrics
from services.paramsync.table import IN_SYNC, LAGGING, SYNCING, VersionTable, lag_deadline_s
from services.paramsync.tensors import as_pairs, build_manifest, raw_bytes, typed_view


def test_a_run_is_split_into_the_parts_of_each_tensor_it_touches():
    # Tensors of 10, 0 and 6 bytes at 0, 10 and 10.
    specs = [TensorSpec(name, "uint8", (size,), size, "") for name, size in (("a", 10), ("e", 0), ("b", 6))]
    m = Manifest(1, tuple(specs))
    assert m.run_parts(0, 0, 4) == [(0, 4)]
    assert m.run_parts(0, 4, 13) == [(4, 6), (10, 0), (10, 3)]
    assert m.run_parts(2, 13, 16) == [(13, 3)]
    # The empty tensor at the run's end belongs to the next run.
    assert m.run_parts(0, 4, 10) == [(4, 6)]
    assert m.run_parts(1, 10, 16) == [(10, 0), (10, 6)]
    for first, start, end, why in [
        (2, 4, 13, "does not lie in tensor 2"),
        (0, 10, 13, "does not lie in tensor 0"),
        (0, 4, 4, "do not lie"),
        (2, 13, 17, "do not lie"),
        (3, 16, 17, "tensor 3 of 3"),
    ]:
        with pytest.raises(ValueError, match=why):
            m.run_parts(first, start, end)


def test_manifest_round_trips_and_describes_every_dtype_exactly():
    state = {
        "bf16": torch.randn(3, 5).to(torch.bfloat16),
        "i64": torch.arange(7),
        "scalar": torch.tensor(1.5),
        "empty": torch.zeros(0, 4),
        "mask": torch.tensor([True, False]),
    }
    m = build_manifest(4, as_pairs(state), trainer_step=9, checksum_algorithm="crc32")
    assert Manifest.from_proto(m.to_proto()) == m
    assert m.total_bytes == 30 + 56 + 4 + 0 + 2
    for spec, (name, tensor) in zip(m.tensors, as_pairs(state), strict=True):
        rebuilt = typed_view(torch.tensor(list(raw_bytes(tensor).cast("B")), dtype=torch.uint8), spec)
        assert torch.equal(rebuilt, state[name]) and spec.name == name


@pytest.mark.parametrize(
    ("tensors", "problem"),
    [
        ((), "lists no tensors"),
        ((TensorSpec("a", "float32", (2,), 8, "x"), TensorSpec("a", "float32", (2,), 8, "x")), "unique"),
        ((TensorSpec("a", "complex64", (2,), 16, "x"),), "unsupported dtype"),
        ((TensorSpec("a", "float32", (2,), 7, "x"),), "num_bytes 7 != 8"),
        (
            (TensorSpec("a", "float32", (2,), 8, "x"), TensorSpec("b", "float32", (2,), 8, "")),
            "every tensor or for none",
        ),
        (
            (TensorSpec("a", "float32", (2,), 8, ""), TensorSpec("b", "float32", (2,), 8, "x")),
            "every tensor or for none",
        ),
    ],
)
def test_malformed_manifests_are_refused_with_the_reason(tensors, problem):
    with pytest.raises(ValueError, match=problem):
        Manifest(1, tensors).validate()


def test_weight_handles_round_trip_and_handles_without_a_host_or_a_bucket_are_refused():
    spec = TensorSpec("a", "uint8", (1,), 1, "x")
    shared = Manifest(1, (spec,), handles=WeightHandles("trainer-host", "flattened_bucket", ("p0", "p1")))
    assert Manifest.from_proto(shared.to_proto()) == shared
    assert Manifest.from_proto(Manifest(1, (spec,)).to_proto()).handles is None
    for host, buckets in (("", ("p0",)), ("trainer-host", ())):
        proto = Manifest(1, (spec,)).to_proto()
        proto.handles.CopyFrom(pb.WeightHandles(host=host, load_format="flattened_bucket", buckets=buckets))
        with pytest.raises(ValueError, match="host and at least one bucket"):
            Manifest.from_proto(proto)


def test_unknown_checksum_algorithm_and_non_positive_version_are_refused():
    with pytest.raises(ValueError, match="checksum_algorithm"):
        Manifest(1, (TensorSpec("a", "uint8", (1,), 1, "x"),), checksum_algorithm="md4").validate()
    with pytest.raises(ValueError, match="positive"):
        Manifest(0, (TensorSpec("a", "uint8", (1,), 1, "x"),)).validate()


def test_table_states_follow_reports_failures_and_deadlines():
    metrics = ParamSyncMetrics()
    table = VersionTable(metrics, max_sync_retries=1, deadline_s=5.0)
    table.ensure("a", "http://a")
    table.ensure("b")
    table.set_latest(2)
    table.record_success("a", 2, sync_s=0.3)
    states = {r.replica_id: r for r in table.snapshot()}
    assert states["a"].state == IN_SYNC and states["b"].state == SYNCING and states["b"].lag_versions == 2

    table.record_failure("b", "replica_reported", "engine refused")
    assert {r.replica_id: r.state for r in table.snapshot()}["b"] == SYNCING
    table.record_failure("b", "replica_reported", "engine refused")
    row = {r.replica_id: r for r in table.snapshot()}["b"]
    assert row.state == LAGGING and row.consecutive_failures == 2 and row.last_error == "engine refused"

    # A late report of an older version never moves a replica back.
    table.record_success("a", 1, sync_s=0.1)
    assert {r.replica_id: r.version for r in table.snapshot()}["a"] == 2

    table.set_latest(3)
    assert table.check_deadlines(time.monotonic() + 1) == []
    assert table.check_deadlines(time.monotonic() + 10) == ["a"]
    body = metrics.service.render()[0].decode()
    assert 'relayrl_paramsync_replica_lag_versions{replica="b"} 3.0' in body
    assert "relayrl_paramsync_replicas_lagging 2.0" in body
    table.remove("b")
    assert 'replica="b"' not in metrics.service.render()[0].decode()


def test_a_resubscribing_replica_that_holds_less_is_shown_behind():
    table = VersionTable(ParamSyncMetrics(), max_sync_retries=1, deadline_s=5.0)
    table.set_latest(4)
    table.record_success("r", 4, sync_s=0.1)
    table.record_subscribed("r", "http://r:1", held_version=0)  # restarted from the base checkpoint
    row = table.snapshot()[0]
    assert (row.version, row.lag_versions, row.state, row.engine_url) == (0, 4, SYNCING, "http://r:1")
    table.record_subscribed("r", "", held_version=9)  # never moves a replica forward by itself
    assert table.snapshot()[0].version == 0


def test_lag_deadline_covers_every_attempt_and_the_backoff():
    assert lag_deadline_s(sync_timeout=10, max_sync_retries=2, sync_retry_delay=1) == 30 + 3


def test_static_replicas_parse_and_bad_ones_name_the_variable():
    assert parse_static_replicas(" a=http://h:1, b=http://h:2 ") == {"a": "http://h:1", "b": "http://h:2"}
    with pytest.raises(ValueError, match="RELAYRL_PARAMSYNC_STATIC_REPLICAS"):
        load_settings(ParamSyncSettings, static_replicas="oops")
    with pytest.raises(ValueError, match="RELAYRL_PARAMSYNC_TRANSPORT"):
        load_settings(ParamSyncSettings, transport="carrier-pigeon")


def test_a_shape_of_millions_of_dimensions_is_refused_at_once():
    # Found by `relayrl fuzz`: the element count of this shape is a ~950,000-digit integer, and
    # computing it held paramsync's event loop for minutes, so every other call timed out.
    spec = TensorSpec("w", "float32", (4,) + (3,) * 2_000_000, 16, "x")
    with pytest.raises(ValueError, match=r"2000001 dims"):
        Manifest(1, (spec,)).validate()

    class NotToBeMultiplied(int):
        def __rmul__(self, other: object) -> int:
            raise AssertionError("the element count was computed past the byte count")

    # The count stops at the first product above the limit: what follows is never multiplied.
    assert _numel_up_to((4, 3, 3, NotToBeMultiplied(3)), 16) == 17
