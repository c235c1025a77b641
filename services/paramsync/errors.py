"""Paramsync's errors and gRPC statuses, in one place: the status each refusal of the core
(:class:`~services.paramsync.store.StoreError`, by reason) is answered with, and the errors the
client raises, one per status a caller may want to handle."""

from __future__ import annotations

import grpc

from relayrl.retry import GRPC_TRANSIENT_CODES, RetryPolicy, grpc_transient
from relayrl.status_errors import StatusError, error_for_status
from services.paramsync.store import StoreError

# The status each refusal is answered with, over gRPC and over the bulk data plane alike.
STATUS_BY_REASON: dict[str, grpc.StatusCode] = {
    "checksum": grpc.StatusCode.DATA_LOSS,
    "out_of_order": grpc.StatusCode.DATA_LOSS,
    "overflow": grpc.StatusCode.DATA_LOSS,
    "incomplete": grpc.StatusCode.DATA_LOSS,
    "not_newer": grpc.StatusCode.FAILED_PRECONDITION,
    "not_found": grpc.StatusCode.NOT_FOUND,
    "idle_timeout": grpc.StatusCode.DEADLINE_EXCEEDED,
    "superseded": grpc.StatusCode.ABORTED,
    "bad_message": grpc.StatusCode.INVALID_ARGUMENT,
    "cannot_resume": grpc.StatusCode.FAILED_PRECONDITION,
}


def status_of(err: StoreError) -> grpc.StatusCode:
    return STATUS_BY_REASON.get(err.reason, grpc.StatusCode.INTERNAL)


class ParamSyncError(StatusError):
    """Any paramsync failure; ``code`` is the gRPC status it came with."""


class VersionConflict(ParamSyncError):
    """The version is not newer than the latest and its content differs (FAILED_PRECONDITION)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class ChecksumMismatch(ParamSyncError):
    """Bytes did not match the manifest, or some were missing (DATA_LOSS); nothing was loaded."""

    code = grpc.StatusCode.DATA_LOSS


class StageDeadline(TimeoutError):
    """A wait on the weight path ran out; the message names the stage, the peer and the version."""

    def __init__(self, stage: str, peer: str, version: int, waited_s: float) -> None:
        super().__init__(f"{stage} of version {version} (peer: {peer}) made no progress for {waited_s:.1f}s")
        self.stage, self.peer, self.version = stage, peer, version


def stage_deadline_error(stage: str, peer: str, version: int, waited_s: float) -> ParamSyncError:
    """The link-level form of :class:`StageDeadline`: DEADLINE_EXCEEDED, so the caller retries (and resumes)."""
    return ParamSyncError(str(StageDeadline(stage, peer, version, waited_s)), grpc.StatusCode.DEADLINE_EXCEEDED)


class VersionUnavailable(ParamSyncError):
    """The requested version is not held (NOT_FOUND) or its upload failed (ABORTED)."""

    code = grpc.StatusCode.NOT_FOUND


_BY_CODE: dict[grpc.StatusCode, type[ParamSyncError]] = {
    grpc.StatusCode.FAILED_PRECONDITION: VersionConflict,
    grpc.StatusCode.DATA_LOSS: ChecksumMismatch,
    grpc.StatusCode.NOT_FOUND: VersionUnavailable,
    grpc.StatusCode.ABORTED: VersionUnavailable,
}

# Failures of the link rather than of the request: worth retrying with backoff.
TRANSIENT_CODES = GRPC_TRANSIENT_CODES


def from_rpc_error(err: grpc.aio.AioRpcError) -> ParamSyncError:
    return error_for_status(ParamSyncError, _BY_CODE, err.code(), f"{err.code().name}: {err.details()}")


def sync_retry_policy(max_sync_retries: int, sync_retry_delay: float) -> RetryPolicy:
    """verl's sync retries: ``max_sync_retries`` tries after the first, ``sync_retry_delay`` seconds
    apart at first and doubling (capped, so a large retry count never waits for hours)."""
    return RetryPolicy(
        attempts=max_sync_retries + 1, first_wait_s=sync_retry_delay, max_wait_s=30 * sync_retry_delay + 1
    )


def is_transient(exc: BaseException) -> bool:
    """A failure of the link rather than of the request, from gRPC or from the data plane."""
    return grpc_transient(exc) or (isinstance(exc, ParamSyncError) and exc.code in TRANSIENT_CODES)


_CODES_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


def from_status(number: int, message: str) -> ParamSyncError:
    """The error for a status the bulk data plane reported as a number (``BulkReply.code``)."""
    code = _CODES_BY_NUMBER.get(number, grpc.StatusCode.UNKNOWN)
    return error_for_status(ParamSyncError, _BY_CODE, code, f"{code.name}: {message}")
