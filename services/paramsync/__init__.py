"""Paramsync: versioned weight broadcast from the trainer to every rollout replica.

The trainer publishes each policy version once (:class:`services.paramsync.client.ParamSyncClient`);
paramsync checks it, keeps the last ``K`` versions and delivers them to every replica in the
delivery mode the ``transport`` setting picks (:mod:`services.paramsync.delivery`: replicas
``pull`` a version, or paramsync ``push`` it), over a byte channel
(:mod:`services.paramsync.channels`: ``tcp``, ``grpc_chunks``, ``disk``, ``torch_dist``).

Rules every caller can rely on:

- Versions are positive and strictly increasing. Re-publishing the latest version with the
  same bytes succeeds without an upload (a restarted trainer does this); an older version, or the
  latest with different bytes, is FAILED_PRECONDITION. Corrupt or missing bytes are DATA_LOSS;
  a failed, partial or killed upload never replaces the version being served.
- Each tensor carries a checksum (xxh3_128 by default, sha256 or crc32 on request; see
  ``digest.py``); paramsync checks it on upload and the client checks it again on fetch, so a
  replica never receives a corrupt version.
- Weight bytes travel over the bulk data plane (plain TCP, ``channels/tcp.py``) when the
  client can reach it, else over the Publish and Fetch gRPC streams
  (``channels/grpc_chunks.py``); both follow these rules.
- With the ``grpc`` transport a version is announced when its upload *starts* and Fetch streams
  its chunks as they arrive; if that upload then fails the Fetch ends with ABORTED and the same
  version may be announced again when the trainer re-sends it (on the data plane paramsync
  closes the connection early instead). A replica should therefore skip
  announcements at or below the version it holds, and never load anything it has not fully
  fetched (``ParamSyncClient.fetch`` returns only complete, verified versions).
- A replica that subscribes (first start or restart) is told the newest version at once.
- The version table lists every replica known from Subscribe, ReportVersion or discovery, with
  its version, lag and state (in_sync, syncing, lagging); Prometheus exports the same.
"""
