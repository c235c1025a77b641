"""How EndpointSlice endpoints become replicas (the kubernetes client's own models as input)."""

from __future__ import annotations

from kubernetes import client

from services.paramsync.discovery_k8s import replicas_from_slices
from services.paramsync.endpoints import ReplicaEndpoint


def endpoint(pod: str | None, address: str, ready: bool | None = True, hostname: str | None = None):
    target = client.V1ObjectReference(kind="Pod", name=pod) if pod else None
    return client.V1Endpoint(
        addresses=[address], conditions=client.V1EndpointConditions(ready=ready), target_ref=target, hostname=hostname
    )


def slice_of(*endpoints, ports=(("engine", 30000), ("http", 8080)), address_type="IPv4"):
    return client.V1EndpointSlice(
        address_type=address_type,
        endpoints=list(endpoints),
        ports=[client.DiscoveryV1EndpointPort(name=n, port=p) for n, p in ports],
        metadata=client.V1ObjectMeta(name="s"),
    )


def test_ready_endpoints_become_replicas_named_after_their_pods() -> None:
    replicas = replicas_from_slices(
        [slice_of(endpoint("rollout-a", "10.0.0.1"), endpoint("rollout-b", "10.0.0.2", ready=False))], "engine"
    )
    assert replicas == {ReplicaEndpoint("rollout-a", "http://10.0.0.1:30000")}


def test_unknown_readiness_counts_as_ready() -> None:
    (replica,) = replicas_from_slices([slice_of(endpoint("rollout-a", "10.0.0.1", ready=None))], "engine")
    assert replica.replica_id == "rollout-a"


def test_ipv6_addresses_are_bracketed() -> None:
    (replica,) = replicas_from_slices([slice_of(endpoint("r", "fd00::5"), address_type="IPv6")], "engine")
    assert replica.engine_url == "http://[fd00::5]:30000"


def test_slices_without_the_engine_port_are_ignored() -> None:
    assert replicas_from_slices([slice_of(endpoint("r", "10.0.0.1"), ports=(("http", 8080),))], "engine") == set()


def test_a_pod_in_two_slices_is_one_replica() -> None:
    slices = [slice_of(endpoint("rollout-a", "10.0.0.1")), slice_of(endpoint("rollout-a", "10.0.0.1"))]
    assert len(replicas_from_slices(slices, "engine")) == 1


def test_endpoints_without_a_pod_fall_back_to_hostname_then_address() -> None:
    replicas = replicas_from_slices(
        [slice_of(endpoint(None, "10.0.0.1", hostname="box-1"), endpoint(None, "10.0.0.2"))], "engine"
    )
    assert {r.replica_id for r in replicas} == {"box-1", "10.0.0.2"}
