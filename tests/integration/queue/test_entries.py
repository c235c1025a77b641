"""``GET /control/entries/{entry_id}``: where a pushed group is (``relayrl ctl group`` asks it for
groups the trainer has not taken): queued, dropped by the queue with the reason, or acknowledged."""

from __future__ import annotations

from pydantic import SecretStr

from relayrl import http_client
from services.queue.client import QueueClient

from .helpers import make_group


async def test_an_entry_is_queued_then_dropped_as_stale_with_its_reason_or_gone_once_acknowledged(start_queue):
    server = await start_queue(api_token=SecretStr("s3cret"))
    base = f"http://127.0.0.1:{server.http.port}/control/entries"
    auth = {"Authorization": "Bearer s3cret"}
    async with QueueClient(server.grpc_address) as client, http_client.async_client(headers=auth) as http:
        old, fresh = await client.push([make_group(1, version=0), make_group(2, version=5)])
        assert (await http.get(f"{base}/{old}")).json()["status"] == "queued"
        assert (await http.get(f"{base}/{old}", headers={"Authorization": "Bearer no"})).status_code == 401

        (delivered,) = await client.pull("trainer-0", current_version=5, max_staleness=1, max_groups=10)
        dropped = (await http.get(f"{base}/{old}")).json()
        assert dropped["status"] == "dropped" and dropped["reason"] == "stale"
        assert "min_policy_version 0 at consumer version 5, max_staleness 1" in dropped["detail"]
        # Delivered and not yet acknowledged (the trainer acks after its checkpoint): still queued.
        assert (await http.get(f"{base}/{fresh}")).json()["status"] == "queued"
        await client.ack("trainer-0", [delivered.entry_id])
        assert (await http.get(f"{base}/{fresh}")).json()["status"] == "gone"


async def test_an_id_redis_would_refuse_is_the_clients_error_and_the_queue_serves_on(start_queue):
    server = await start_queue(api_token=SecretStr("s3cret"))
    base = f"http://127.0.0.1:{server.http.port}/control/entries"
    auth = {"Authorization": "Bearer s3cret"}
    async with QueueClient(server.grpc_address) as client, http_client.async_client(headers=auth) as http:
        (entry,) = await client.push([make_group(1, version=0)])
        # The shape's pattern allows 20 digits a part; Redis takes each part only below 2**64.
        for bad in (f"{2**64}-0", f"1-{2**64 + 5}", "\u0661-\u0662"):
            response = await http.get(f"{base}/{bad}")
            assert response.status_code == 422, (bad, response.text)
            assert "2**64" in response.text or "pattern" in response.text
        assert (await http.get(f"{base}/{2**64 - 1}-0")).json()["status"] == "gone"
        assert (await http.get(f"{base}/{entry}")).json()["status"] == "queued"
