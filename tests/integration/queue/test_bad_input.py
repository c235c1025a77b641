"""Bad input never crashes the queue: clear gRPC statuses, garbage goes to the dead-letter stream."""

from __future__ import annotations

import copy

import grpc
import pytest

from relayrl import http_client
from relayrl.schema import Group, Sample
from relayrl.v1 import queue_pb2 as qpb
from relayrl.v1 import queue_pb2_grpc as qgrpc
from relayrl.v1 import trajectory_pb2 as tpb
from services.queue.client import QueueClient
from services.queue.errors import BadRequest
from services.queue.keys import Keys
from tests.waiting import wait_until_async

from .helpers import make_group


async def test_garbage_written_into_redis_is_dead_lettered_and_serving_goes_on(start_queue, raw_redis):
    server = await start_queue()
    keys = Keys(server.settings.run_id)
    fine = make_group(3, version=1).to_proto()
    await raw_redis.xadd(keys.trajectories, {"junk": "no header at all"})
    await raw_redis.xadd(keys.trajectories, {"v_min": 1, "payload": b"\xff\xfe not protobuf"})
    lying = make_group(4, version=1).to_proto()
    lying.trajectories[0].behavior_logprobs.append(-1.0)  # one more log-prob than tokens
    await raw_redis.xadd(keys.trajectories, {"v_min": 1, "payload": lying.SerializeToString()})
    await raw_redis.xadd(keys.trajectories, {"v_min": 1, "payload": fine.SerializeToString()})

    async with QueueClient(server.grpc_address) as client:
        got = await client.pull("trainer-0", current_version=1, max_staleness=0, max_groups=10)
        assert [d.group.group_id for d in got] == ["g3"]
        stats = await client.stats()
        assert stats.dropped_by_reason["malformed"] == 3
        assert stats.queue_size == 0 and stats.pending == 1

    dead = [fields for _, fields in await raw_redis.xrange(keys.dead_letter)]
    assert [f[b"reason"] for f in dead] == [b"malformed"] * 3
    details = [f[b"detail"].decode() for f in dead]
    assert "v_min" in details[0]
    assert "does not decode" in details[1]
    assert "behavior_logprobs" in details[2]
    # The original fields are kept for inspection.
    assert dead[0][b"field:junk"] == b"no header at all"


async def test_malformed_push_is_refused_with_every_problem_and_nothing_is_queued(start_queue, raw_redis):
    server = await start_queue()
    bad = make_group(1).to_proto()
    bad.group_id = ""
    bad.trajectories[1].policy_versions.append(0)
    async with QueueClient(server.grpc_address) as client:
        with pytest.raises(BadRequest) as err:
            await client.push_protos([make_group(0).to_proto(), bad])
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "group_id is empty" in err.value.details
        assert "trajectory 1: 4 policy_versions for 3 response tokens" in err.value.details
        stats = await client.stats()
        # All or nothing: the good group of the same push was not stored either.
        assert stats.total_produced == 0 and stats.queue_size == 0
        assert stats.dropped_by_reason["malformed"] == 1
    assert await raw_redis.xlen(Keys(server.settings.run_id).dead_letter) == 1


@pytest.mark.parametrize(
    ("request_", "needle"),
    [
        (qpb.PullRequest(consumer="", current_version=1, max_groups=1), "consumer"),
        (qpb.PullRequest(consumer="t", current_version=-1, max_groups=1), "current_version"),
        (qpb.PullRequest(consumer="t", current_version=1, max_staleness=-2, max_groups=1), "max_staleness"),
        (qpb.PullRequest(consumer="t", current_version=1, max_groups=0), "max_groups"),
        (qpb.PullRequest(consumer="t", current_version=1, max_groups=1, block_timeout_s=-1), "block_timeout_s"),
        (qpb.PullRequest(consumer="t", max_groups=1, held=qpb.HeldEntries(entry_ids=["1-0"] * 4097)), "capacity"),
        (qpb.AckRequest(consumer="t", entry_ids=["not-an-id"]), "not stream entry ids"),
        (qpb.AckRequest(consumer="t", entry_ids=["1-0", f"{2**64}-0"]), "not stream entry ids"),
        (qpb.PushRequest(), "no groups"),
        (qpb.PushRequest(groups=[make_group(0).to_proto()], timeout_s=-1), "timeout_s"),
    ],
)
async def test_bad_trajectory_arguments_get_invalid_argument(start_queue, request_, needle):
    server = await start_queue()
    async with grpc.aio.insecure_channel(server.grpc_address) as channel:
        stub = qgrpc.TrajectoryQueueStub(channel)
        method = {qpb.PullRequest: stub.Pull, qpb.AckRequest: stub.Ack, qpb.PushRequest: stub.Push}[type(request_)]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await method(request_)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert needle in err.value.details()
        # The service is still serving.
        assert (await stub.Stats(qpb.StatsRequest())).capacity == server.settings.capacity


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"\x0a\x20truncated", "PushRequest does not decode"),
        (qpb.PushRequest(groups=[make_group(0).to_proto()]).SerializeToString() + b"\x0a\x03\xff\xff\xff", "decode"),
    ],
)
async def test_undecodable_push_bytes_get_invalid_argument(start_queue, body, needle):
    server = await start_queue()
    async with grpc.aio.insecure_channel(server.grpc_address) as channel:
        push = channel.unary_unary("/relayrl.v1.TrajectoryQueue/Push", request_serializer=bytes)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await push(body)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert needle in err.value.details()
    async with QueueClient(server.grpc_address) as client:
        assert (await client.stats()).total_produced == 0


@pytest.mark.parametrize(
    ("request_", "needle"),
    [
        (qpb.ReleaseRequest(), "no prompts"),
        (qpb.ReleaseRequest(prompts=[tpb.PromptGroup(prompt_id="p", n_samples=0)]), "n_samples"),
        (qpb.ReleaseRequest(prompts=[tpb.PromptGroup(prompt_id="p", n_samples=1)], release_id="r" * 65), "release_id"),
        (qpb.LeaseRequest(replica_id="", max_prompts=1), "replica_id"),
        (qpb.LeaseRequest(replica_id="r", max_prompts=0), "max_prompts"),
        (qpb.LeaseRequest(replica_id="r", max_prompts=1, held_version=-1), "held_version"),
        (qpb.CompleteRequest(replica_id="r", lease_ids=["bogus"]), "not a lease id"),
        (qpb.AbandonRequest(replica_id="r", reason="x", keep_lease_ids=["000000000001.1"]), "needs all_held"),
        (qpb.AbandonRequest(replica_id="r", reason="x", all_held=True, keep_lease_ids=["bogus"]), "not a lease id"),
    ],
)
async def test_bad_prompt_arguments_get_invalid_argument(start_queue, request_, needle):
    server = await start_queue()
    async with grpc.aio.insecure_channel(server.grpc_address) as channel:
        stub = qgrpc.PromptQueueStub(channel)
        method = {
            qpb.ReleaseRequest: stub.Release,
            qpb.LeaseRequest: stub.Lease,
            qpb.CompleteRequest: stub.Complete,
            qpb.AbandonRequest: stub.Abandon,
        }[type(request_)]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await method(request_)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert needle in err.value.details()


async def test_http_probes_and_metrics(start_queue):
    server = await start_queue(stats_refresh_s=0.05)
    async with QueueClient(server.grpc_address) as client:
        await client.push([make_group(1, version=0), make_group(2, version=2)])
        await client.pull("trainer-0", current_version=2, max_staleness=1, max_groups=5)
    async with http_client.async_client(base_url=f"http://127.0.0.1:{server.http.port}") as http:
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get("/readyz")).status_code == 200

        async def metrics_once_refreshed() -> str:
            body = (await http.get("/metrics")).text
            return body if "relayrl_queue_total_produced_groups 2.0" in body else ""

        body = await wait_until_async(metrics_once_refreshed, 2.5, "the gauges to count both pushes")
        assert "relayrl_queue_total_produced_groups 2.0" in body
        assert 'relayrl_queue_dropped_samples_groups{reason="stale"} 1.0' in body
        assert "relayrl_queue_stale_samples_ratio 0.5" in body
        assert "relayrl_queue_pull_latency_seconds_count" in body
        assert "relayrl_queue_max_sample_age_versions 0.0" in body


async def test_the_queue_recovers_when_its_stream_is_deleted_under_it(start_queue, raw_redis):
    server = await start_queue()
    async with QueueClient(server.grpc_address) as client:
        await client.push([make_group(0)])
        await raw_redis.delete(Keys(server.settings.run_id).trajectories)
        assert (await client.stats()).queue_size == 0
        assert await client.pull("trainer-0", current_version=0, max_staleness=0, max_groups=1) == []
        await client.push([make_group(1)])
        got = await client.pull("trainer-0", current_version=0, max_staleness=0, max_groups=1)
        assert [d.group.group_id for d in got] == ["g1"]


async def test_nan_waits_get_invalid_argument(start_queue):
    # Found by `relayrl fuzz`: NaN passed the `< 0` check and failed later as UNKNOWN.
    server = await start_queue()
    async with grpc.aio.insecure_channel(server.grpc_address) as channel:
        trajectories, prompts = qgrpc.TrajectoryQueueStub(channel), qgrpc.PromptQueueStub(channel)
        calls = [
            trajectories.Pull(qpb.PullRequest(consumer="c", max_groups=1, block_timeout_s=float("nan")), timeout=10),
            trajectories.Push(qpb.PushRequest(groups=[make_group(1).to_proto()], timeout_s=float("nan")), timeout=10),
            prompts.Lease(qpb.LeaseRequest(replica_id="r", max_prompts=1, block_timeout_s=float("nan")), timeout=10),
        ]
        for call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "nan" in err.value.details()


def _episode_group(i: int) -> Group:
    """Two samples of a two-turn episode: model 0-1, observation 2-3, model 4-5."""
    sample = Sample(
        prompt_token_ids=[1, 2, 3],
        response_token_ids=[10, 11, 50, 51, 12, 13],
        behavior_logprobs=[-0.5, -0.5, 0.0, 0.0, -0.25, -0.25],
        # Observation tokens carry no policy's version that counts: 0 there must not age the episode.
        policy_versions=[1, 1, 0, 0, 2, 2],
        reward=1.0,
        token_rewards=[0.0, 0.5, 0.0, 0.0, 0.0, 0.0],
        loss_mask=[1, 1, 0, 0, 1, 1],
        turn_ends=[2, 6],
    )
    return Group(group_id=f"e{i}", prompt_id=f"ds/{i}", samples=[sample, copy.deepcopy(sample)])


def _mask_too_long(t: tpb.Trajectory) -> None:
    t.loss_mask.append(1)


def _mask_not_binary(t: tpb.Trajectory) -> None:
    t.loss_mask[2] = 3


def _mask_all_zeros(t: tpb.Trajectory) -> None:
    t.loss_mask[:] = [0] * 6


def _logprob_on_observation(t: tpb.Trajectory) -> None:
    t.behavior_logprobs[2] = -1.5


def _turn_end_on_observation(t: tpb.Trajectory) -> None:
    t.turn_ends[:] = [3, 6]


def _turn_ends_past_the_response(t: tpb.Trajectory) -> None:
    t.turn_ends[:] = [2, 7]


async def test_malformed_episodes_are_dead_lettered_with_the_field_at_fault(start_queue, raw_redis):
    server = await start_queue()
    cases = [
        (_mask_too_long, "trajectory 1: 7 loss_mask for 6 response tokens"),
        (_mask_not_binary, "trajectory 1: loss_mask values must be 0 or 1"),
        (_mask_all_zeros, "trajectory 1: loss_mask is all zeros"),
        (_logprob_on_observation, "trajectory 1: behavior_logprobs must be 0.0 where loss_mask is 0; position 2"),
        (_turn_end_on_observation, "trajectory 1: turn_ends entry 3 does not end a model turn"),
        (_turn_ends_past_the_response, "trajectory 1: turn_ends must lie in [1, 6]"),
    ]
    async with QueueClient(server.grpc_address) as client:
        for i, (spoil, reason) in enumerate(cases):
            bad = _episode_group(i).to_proto()
            spoil(bad.trajectories[1])
            with pytest.raises(BadRequest) as err:
                await client.push_protos([bad])
            assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and reason in err.value.details
        stats = await client.stats()
        assert stats.total_produced == 0 and stats.dropped_by_reason["malformed"] == len(cases)
    dead = [fields for _, fields in await raw_redis.xrange(Keys(server.settings.run_id).dead_letter)]
    assert [f[b"reason"] for f in dead] == [b"malformed"] * len(cases)
    for fields, (_, reason) in zip(dead, cases, strict=True):
        assert reason in fields[b"detail"].decode()


async def test_a_well_formed_episode_is_delivered_token_exact(start_queue):
    server = await start_queue()
    sent = _episode_group(0)
    async with QueueClient(server.grpc_address) as client:
        await client.push([sent])
        # Judged on its oldest model token (version 1), the episode is fresh at 2 with η = 1.
        got = await client.pull("trainer-0", current_version=2, max_staleness=1, max_groups=1)
    assert [d.group.samples for d in got] == [sent.samples]
