"""Replica discovery inside Kubernetes: the ready endpoints of the rollout Service.

Each rollout pod is one replica. The EndpointSlice controller lists the pods behind the rollout
Service in EndpointSlices (labelled ``kubernetes.io/service-name=<service>``); this source lists
them once, then watches from the list's ``resourceVersion``:

- every ready endpoint becomes ``ReplicaEndpoint(replica_id=<pod name>, engine_url=http://<ip>:<port>)``,
  the port being the slice port named ``port_name`` (the chart names the engine port ``engine``);
- a watch that ends (server timeout, dropped connection) resumes from the last resourceVersion
  seen, including bookmarks; a ``410 Gone`` (history compacted) or any other API error relists
  from scratch after a short delay, so transient API-server trouble never ends discovery;
- an endpoint that turns not-ready or disappears leaves the set, and paramsync drops its row.

The ``kubernetes`` client is synchronous, so the list/watch loop runs in a daemon thread and hands
each new replica set to the event loop; cancelling ``watch()`` stops the thread's stream at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

from relayrl.retry import RetryPolicy, any_error, retrying_sync
from services.paramsync.endpoints import ReplicaEndpoint

log = logging.getLogger(__name__)

_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def own_namespace() -> str:
    """The namespace this pod runs in (from its service-account mount)."""
    try:
        return _NAMESPACE_FILE.read_text().strip()
    except OSError as exc:
        raise ValueError(
            "kubernetes discovery needs RELAYRL_PARAMSYNC_K8S_NAMESPACE outside a pod"
            f" (no {_NAMESPACE_FILE}: {exc.strerror})"
        ) from None


def default_api_client() -> client.ApiClient:
    """In a pod: the service account's credentials; elsewhere: the current kubeconfig context."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(client_configuration=configuration)
    return client.ApiClient(configuration)


def _engine_url(address: str, port: int) -> str:
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(address).version == 6:
            address = f"[{address}]"
    return f"http://{address}:{port}"


def replicas_from_slices(slices: Iterable[client.V1EndpointSlice], port_name: str) -> frozenset[ReplicaEndpoint]:
    """Every ready endpoint of ``slices`` as a replica; endpoints without the named port are skipped."""
    replicas: dict[str, ReplicaEndpoint] = {}
    for endpoint_slice in slices:
        port = next((p.port for p in endpoint_slice.ports or () if (p.name or "") == port_name and p.port), None)
        if port is None:
            continue
        for endpoint in endpoint_slice.endpoints or ():
            # The API says an unknown readiness (None) should be taken as ready.
            if endpoint.conditions is not None and endpoint.conditions.ready is False:
                continue
            if not endpoint.addresses:
                continue
            target = endpoint.target_ref
            replica_id = target.name if target is not None and target.name else endpoint.hostname
            replica_id = replica_id or endpoint.addresses[0]
            # During a rollout one pod may appear in two slices; one row per pod.
            replicas.setdefault(replica_id, ReplicaEndpoint(replica_id, _engine_url(endpoint.addresses[0], port)))
    return frozenset(replicas.values())


class KubernetesDiscovery:
    """Replicas are the ready endpoints of the EndpointSlices matching ``label_selector``."""

    def __init__(
        self,
        namespace: str = "",
        label_selector: str = "app.kubernetes.io/component=rollout",
        *,
        port_name: str = "engine",
        api_client: client.ApiClient | None = None,
        watch_timeout_s: int = 300,
        retry_delay_s: float = 2.0,
    ) -> None:
        self.namespace = namespace or own_namespace()
        self.label_selector = label_selector
        self.port_name = port_name
        self.watch_timeout_s = watch_timeout_s
        self.retry_delay_s = retry_delay_s
        self._api_client = api_client

    def api(self) -> client.DiscoveryV1Api:
        if self._api_client is None:
            self._api_client = default_api_client()
        return client.DiscoveryV1Api(self._api_client)

    async def watch(self) -> AsyncIterator[frozenset[ReplicaEndpoint]]:
        loop = asyncio.get_running_loop()
        updates: asyncio.Queue[frozenset[ReplicaEndpoint]] = asyncio.Queue()
        follower = _SliceFollower(self, lambda replicas: loop.call_soon_threadsafe(updates.put_nowait, replicas))
        thread = threading.Thread(target=follower.run, name="paramsync-k8s-discovery", daemon=True)
        thread.start()
        try:
            last: frozenset[ReplicaEndpoint] | None = None
            while True:
                replicas = await updates.get()
                if replicas != last:
                    last = replicas
                    yield replicas
        finally:
            follower.stop()


class _SliceFollower:
    """The list-then-watch loop, run in one thread; ``publish`` gets the replica set after each change."""

    def __init__(self, source: KubernetesDiscovery, publish: Callable[[frozenset[ReplicaEndpoint]], Any]) -> None:
        self._source = source
        self._publish = publish
        self._stopped = threading.Event()
        self._watch: watch.Watch | None = None
        self._slices: dict[str, client.V1EndpointSlice] = {}

    def stop(self) -> None:
        self._stopped.set()
        if self._watch is not None:
            self._watch.stop()

    def run(self) -> None:
        """Lists, then watches from the listing's version, until stopped. A failed list or watch
        (the API refusing us, the connection, DNS, TLS, a truncated body) is retried after
        ``retry_delay_s``, from a fresh list, for as long as the follower runs."""
        delay = self._source.retry_delay_s
        policy = RetryPolicy(attempts=None, first_wait_s=delay, max_wait_s=delay)
        resource_version: str | None = None
        while not self._stopped.is_set():
            for attempt in retrying_sync("endpointslice list/watch", any_error, policy, log, sleep=self._stopped.wait):
                with attempt:
                    start_from, resource_version = resource_version, None
                    if not self._stopped.is_set():
                        resource_version = self._watch_once(start_from)

    def _watch_once(self, resource_version: str | None) -> str | None:
        """One watch (after a list when there is no version to resume from); the version to resume
        from, or None when the API compacted ours away (410 Gone) and only a fresh list is safe."""
        try:
            return self._follow(resource_version or self._relist())
        except client.ApiException as exc:
            if exc.status != 410:
                raise
            log.info("endpointslice history compacted past our version; relisting")
            return None

    def _relist(self) -> str:
        source = self._source
        listing = source.api().list_namespaced_endpoint_slice(
            source.namespace, label_selector=source.label_selector, _request_timeout=30
        )
        self._slices = {s.metadata.name: s for s in listing.items}
        self._emit()
        return listing.metadata.resource_version

    def _follow(self, resource_version: str) -> str:
        """Applies watch events until the stream ends; returns the resourceVersion to resume from."""
        source = self._source
        self._watch = watch.Watch()
        stream = self._watch.stream(
            source.api().list_namespaced_endpoint_slice,
            source.namespace,
            label_selector=source.label_selector,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=source.watch_timeout_s,
            # A silent dead connection must not hang discovery: no byte for this long → reconnect.
            _request_timeout=(10, source.watch_timeout_s + 30),
        )
        for event in stream:
            if self._stopped.is_set():
                break
            kind, obj = event["type"], event["object"]
            if kind == "BOOKMARK":
                resource_version = event["raw_object"]["metadata"]["resourceVersion"]
                continue
            if kind == "DELETED":
                self._slices.pop(obj.metadata.name, None)
            else:
                self._slices[obj.metadata.name] = obj
            resource_version = obj.metadata.resource_version
            self._emit()
        return resource_version

    def _emit(self) -> None:
        try:
            self._publish(replicas_from_slices(self._slices.values(), self._source.port_name))
        except RuntimeError:
            # The event loop that wanted these updates is gone; nobody is listening any more.
            self._stopped.set()
