"""Settings of the paramsync service, read from ``RELAYRL_PARAMSYNC_*`` (and the shared ``RELAYRL_*``).

verl's weight-sync names map one to one: ``max_sync_retries`` (attempts after the first before
a replica is marked lagging), ``sync_timeout`` (seconds one sync attempt may take) and
``sync_retry_delay`` (seconds before the first retry, doubling after each).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator

from relayrl.config import ServiceSettings


class ParamSyncSettings(ServiceSettings):
    service_name: ClassVar[str] = "paramsync"

    transport: str = Field(
        "grpc",
        pattern="^(grpc|disk|distributed)$",
        description="How versions reach replicas: 'grpc' (replicas pull chunk streams; the CPU default),"
        " 'disk' (safetensors under shared_dir, replicas load them with /update_weights_from_disk),"
        " 'distributed' (paramsync broadcasts into the engines over torch.distributed).",
    )
    data_plane: bool = Field(
        True,
        description="Serve the bulk data plane: Publish and Fetch over plain TCP at close to socket speed"
        " (clients learn its port from the DataPlane RPC and fall back to gRPC streams without it).",
    )
    data_port: int = Field(
        0, ge=0, le=65535, description="TCP port of the bulk data plane (same host as gRPC); 0 picks a free port."
    )
    forward_streams: int = Field(
        1,
        ge=0,
        description="Data plane: replicas fed a version while it is still uploading; the others start when it is"
        " complete (0: all). Each stream fed during the upload slows it: the trainer's upload comes first.",
    )
    keep_versions: int = Field(2, ge=1, le=64, description="K: how many recent versions stay in memory.")
    store_dir: str = Field(
        "",
        description="If set, each version is also written there as safetensors (the last K kept) and the latest"
        " is loaded back at start-up, so a restarted paramsync serves it at once. Empty: memory only.",
    )
    shared_dir: str = Field(
        "", description="disk transport: directory on a volume every engine mounts; one sub-directory per version."
    )
    chunk_bytes: int = Field(
        4 * 1024 * 1024, ge=4096, le=64 * 1024 * 1024, description="Size of the chunks a Fetch stream sends, bytes."
    )
    upload_idle_timeout_s: float = Field(
        30.0, gt=0, description="An upload that sends nothing for this long fails; the previous version stays."
    )
    upload_resume_window_s: float = Field(
        10.0,
        gt=0,
        description="An upload whose link to the trainer broke stays open this long, so the trainer's retry resumes"
        " it from the bucket it still holds; then it is dropped and the previous version stays. Keep it above the"
        " trainer's retry backoff (sync_retry_delay × (2^max_sync_retries − 1): 7 s with verl's defaults).",
    )
    max_sync_retries: int = Field(3, ge=0, description="Retries per replica before it is marked lagging (verl).")
    sync_timeout: float = Field(60.0, gt=0, description="Seconds one sync attempt of one replica may take (verl).")
    sync_retry_delay: float = Field(1.0, ge=0, description="Seconds before the first retry, doubling after (verl).")
    static_replicas: str = Field(
        "",
        description="Replicas known in advance, 'id=engine_url' separated by commas"
        " (e.g. 'rollout-0=http://10.0.0.5:30000'); replicas that subscribe are added as well.",
    )
    discovery: str = Field(
        "static",
        pattern="^(static|kubernetes)$",
        description="Where the replica list comes from: 'static' (static_replicas) or 'kubernetes' (EndpointSlices).",
    )
    k8s_namespace: str = Field(
        "", description="kubernetes discovery: namespace to watch; empty: the pod's own namespace."
    )
    k8s_label_selector: str = Field(
        "app.kubernetes.io/component=rollout",
        description="kubernetes discovery: label selector of the EndpointSlices whose ready endpoints are replicas.",
    )
    dist_master_addr: str = Field(
        "127.0.0.1", description="distributed transport: address of paramsync the engines connect to (rank 0)."
    )
    dist_master_port: int = Field(0, ge=0, le=65535, description="distributed transport: group port; 0 picks one.")
    dist_backend: str = Field(
        "gloo", pattern="^(gloo|nccl)$", description="distributed transport: 'gloo' on CPU, 'nccl' on GPUs."
    )
    dist_bucket_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, description="distributed transport: bytes broadcast per engine call."
    )

    @field_validator("static_replicas")
    @classmethod
    def _check_static(cls, value: str) -> str:
        parse_static_replicas(value)
        return value

    def replica_endpoints(self) -> dict[str, str]:
        return parse_static_replicas(self.static_replicas)


def parse_static_replicas(text: str) -> dict[str, str]:
    """``"a=http://h:1,b=http://h:2"`` → ``{"a": "http://h:1", "b": "http://h:2"}``."""
    replicas: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        replica_id, sep, url = item.partition("=")
        if not sep or not replica_id.strip():
            raise ValueError(f"static replica {item!r} is not 'id=engine_url'")
        if replica_id.strip() in replicas:
            raise ValueError(f"static replica {replica_id.strip()!r} listed twice")
        replicas[replica_id.strip()] = url.strip()
    return replicas
