"""The versioned store's rules: what uploads are accepted, what stays served after a failure."""

import hashlib

import grpc
import pytest

from services.paramsync.errors import status_of
from services.paramsync.manifest import Manifest, TensorSpec
from services.paramsync.store import StoreError, UploadWriter, VersionState, VersionStore


def manifest(version: int, payload: dict[str, bytes]) -> Manifest:
    specs = tuple(
        TensorSpec(name, "uint8", (len(data),), len(data), hashlib.sha256(data).hexdigest())
        for name, data in payload.items()
    )
    return Manifest(version, specs, checksum_algorithm="sha256")


def upload(store: VersionStore, version: int, payload: dict[str, bytes]) -> None:
    stored = store.begin(manifest(version, payload))
    assert stored is not None
    writer = UploadWriter(stored)
    for name, data in payload.items():
        writer.accept(name, 0, data)
    writer.finish()
    store.commit(stored)


def test_versions_must_increase_and_identical_republish_is_a_no_op():
    store = VersionStore(keep_versions=2)
    upload(store, 1, {"w": b"abc"})
    assert store.begin(manifest(1, {"w": b"abc"})) is None
    with pytest.raises(StoreError) as err:
        store.begin(manifest(1, {"w": b"abd"}))
    assert status_of(err.value) == grpc.StatusCode.FAILED_PRECONDITION
    upload(store, 3, {"w": b"xyz"})
    with pytest.raises(StoreError, match="not newer than the latest version 3"):
        store.begin(manifest(2, {"w": b"abc"}))
    assert store.latest_version == 3


def test_only_the_last_k_versions_are_kept():
    store = VersionStore(keep_versions=2)
    for v in (1, 2, 3):
        upload(store, v, {"w": bytes([v])})
    assert store.versions() == [2, 3]
    with pytest.raises(StoreError) as err:
        store.get(1)
    assert status_of(err.value) == grpc.StatusCode.NOT_FOUND


def test_a_corrupt_tensor_fails_the_upload_and_the_previous_version_stays():
    store = VersionStore(keep_versions=2)
    upload(store, 1, {"w": b"good"})
    stored = store.begin(manifest(2, {"w": b"fine", "b": b"x"}))
    writer = UploadWriter(stored)
    with pytest.raises(StoreError) as err:
        writer.accept("w", 0, b"fire")
    assert status_of(err.value) == grpc.StatusCode.DATA_LOSS and err.value.reason == "checksum"
    store.fail(stored, str(err.value))
    assert store.latest_version == 1 and bytes(store.get(0).data) == b"good"
    assert stored.state is VersionState.FAILED


@pytest.mark.parametrize(
    ("chunks", "reason"),
    [
        ([("w", 1, b"b")], "out_of_order"),
        ([("b", 0, b"x")], "out_of_order"),
        ([("w", 0, b"abcd")], "overflow"),
    ],
)
def test_chunks_out_of_order_or_oversized_are_refused(chunks, reason):
    store = VersionStore(keep_versions=1)
    writer = UploadWriter(store.begin(manifest(1, {"w": b"abc", "b": b"x"})))
    with pytest.raises(StoreError) as err:
        for name, offset, data in chunks:
            writer.accept(name, offset, data)
    assert err.value.reason == reason


def test_missing_bytes_fail_the_upload():
    store = VersionStore(keep_versions=1)
    writer = UploadWriter(store.begin(manifest(1, {"w": b"abc", "b": b"x"})))
    writer.accept("w", 0, b"abc")
    with pytest.raises(StoreError, match="after 3 of 4 bytes") as err:
        writer.finish()
    assert status_of(err.value) == grpc.StatusCode.DATA_LOSS


def test_a_new_upload_supersedes_an_unfinished_one_of_the_same_version():
    store = VersionStore(keep_versions=1)
    first = store.begin(manifest(2, {"w": b"abc"}))
    second = store.begin(manifest(2, {"w": b"abc"}))
    assert first.state is VersionState.FAILED and "superseded" in first.error
    assert store.uploading is second
    with pytest.raises(StoreError, match="older than version 2 being uploaded"):
        store.begin(manifest(1, {"w": b"abc"}))


def test_bytes_received_in_place_are_checked_across_tensor_boundaries():
    payload = {"a": b"abc", "empty": b"", "b": b"defgh"}
    store = VersionStore(keep_versions=1)
    stored = store.begin(manifest(1, payload))
    writer = UploadWriter(stored)
    stored.data[:] = b"abcdefgh"
    writer.check_in_place(0, 2)  # inside "a"
    writer.check_in_place(2, 4)  # the end of "a", the empty tensor, the start of "b"
    writer.check_in_place(6, 2)
    stored.received = 8
    writer.finish()

    corrupt = VersionStore(keep_versions=1).begin(manifest(1, payload))
    corrupt.data[:] = b"abXdefgh"
    with pytest.raises(StoreError, match="'a'") as err:
        UploadWriter(corrupt).check_in_place(0, 8)
    assert err.value.reason == "checksum"
    with pytest.raises(StoreError) as err:
        UploadWriter(corrupt).check_in_place(4, 5)
    assert err.value.reason == "overflow"


def test_a_streamed_upload_resumes_where_its_last_run_began_even_inside_a_tensor():
    """A tensor larger than the trainer's bucket spans runs; its checksum comes with its last run.
    A link that breaks inside the second run resumes from that run's start, inside the tensor."""
    payload = {"big": b"0123456789", "small": b"xy"}
    full = manifest(1, payload)
    opened = Manifest(1, tuple(TensorSpec(s.name, s.dtype, s.shape, s.num_bytes, "") for s in full.tensors), "sha256")
    stored = VersionStore(keep_versions=1).begin(opened)
    writer = stored.writer
    writer.begin_run()
    writer.accept("big", 0, b"0123")  # run 1: the first rows of "big", no checksum yet
    writer.add_checksums(0, [full.tensors[0].checksum])
    writer.begin_run()  # run 2 starts inside "big"
    writer.accept("big", 4, b"456")
    # Neither a byte inside the run nor one inside an earlier run can be resumed from...
    for position in (5, 2):
        with pytest.raises(StoreError) as err:
            writer.rewind(position)
        assert err.value.reason == "cannot_resume"
    # ...the run's start can: the bytes of "big" before it stay counted in its hash.
    writer.rewind(4)
    assert writer.position == 4
    writer.accept("big", 4, b"456789")
    writer.add_checksums(1, [full.tensors[1].checksum])
    writer.accept("small", 0, b"xy")
    assert writer.finish().tensors == full.tensors

    wrong = VersionStore(keep_versions=1).begin(opened).writer
    wrong.accept("big", 0, b"0123")
    wrong.add_checksums(0, [full.tensors[0].checksum])
    wrong.begin_run()
    wrong.rewind(4)
    with pytest.raises(StoreError) as err:
        wrong.accept("big", 4, b"456788")
    assert err.value.reason == "checksum"


def test_an_evicted_version_memory_is_reused_only_when_nobody_reads_it():
    store = VersionStore(keep_versions=1)
    upload(store, 1, {"w": b"one"})
    first = store.get(1)
    upload(store, 2, {"w": b"two"})  # evicts version 1, nobody reading: its memory is reused next
    upload(store, 3, {"w": b"333"})
    assert store.get(3).memory is first.memory and bytes(store.get(3).data) == b"333"

    with store.get(3).reading():
        upload(store, 4, {"w": b"444"})  # evicts version 3 while it is read
        upload(store, 5, {"w": b"555"})
    assert store.get(5).memory is not first.memory
