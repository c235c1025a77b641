"""Each gRPC service's valid requests (what mutations start from) and its nothing-lost check:
work accepted before the fuzzing is still accounted for after it, and valid calls still succeed."""

from __future__ import annotations

import itertools
import random

from commands.fuzz.grpc_fuzz import Method, methods_of
from commands.fuzz.report import Tally
from relayrl.v1 import paramsync_pb2 as ppb
from relayrl.v1 import queue_pb2 as qpb
from relayrl.v1 import rollout_pb2 as rpb
from relayrl.v1 import trajectory_pb2 as tpb

KEEP_GROUPS = 8


def _group(rng: random.Random, i: int) -> tpb.TrajectoryGroup:
    n = rng.randint(1, 6)
    traj = tpb.Trajectory(
        prompt_token_ids=[1, 2, 3],
        response_token_ids=[rng.randint(0, 100) for _ in range(n)],
        behavior_logprobs=[-0.5] * n,
        policy_versions=[0] * n,
        reward=1.0,
    )
    return tpb.TrajectoryGroup(
        group_id=f"g{i}", prompt_id=f"p{i}", trajectories=[traj, traj], min_policy_version=0, max_policy_version=0
    )


def queue_methods() -> list[Method]:
    ids = itertools.count()
    t = {
        "Push": lambda r: [qpb.PushRequest(groups=[_group(r, next(ids))], timeout_s=0.05)],
        "Pull": lambda r: [qpb.PullRequest(consumer="fuzz", current_version=0, max_staleness=4, max_groups=2)],
        "Ack": lambda r: [qpb.AckRequest(consumer="fuzz", entry_ids=[f"{r.randint(1, 10**13)}-0"])],
        "Release": lambda r: [
            qpb.ReleaseRequest(
                prompts=[tpb.PromptGroup(prompt_id=f"p{next(ids)}", prompt_token_ids=[1, 2], n_samples=2)]
            )
        ],
        "Lease": lambda r: [qpb.LeaseRequest(replica_id="fuzz", max_prompts=1, block_timeout_s=0.05)],
        "Complete": lambda r: [qpb.CompleteRequest(replica_id="fuzz", lease_ids=[f"l{r.randint(0, 99)}"])],
        "Renew": lambda r: [qpb.RenewRequest(replica_id="fuzz", lease_ids=[f"l{r.randint(0, 99)}"])],
    }
    services = qpb.DESCRIPTOR.services_by_name
    return methods_of(services["TrajectoryQueue"], t) + methods_of(services["PromptQueue"], t)


def paramsync_methods() -> list[Method]:
    import torch

    from services.paramsync.tensors import build_manifest, raw_bytes

    versions = itertools.count(1000)

    def publish(r: random.Random) -> list[ppb.WeightStreamMessage]:
        tensor = torch.full((4,), float(r.randint(0, 9)))
        manifest = build_manifest(next(versions), [("w", tensor)], 0, "sha256")
        chunk = ppb.WeightChunk(tensor_name="w", offset=0, data=bytes(raw_bytes(tensor)))
        return [ppb.WeightStreamMessage(manifest=manifest.to_proto()), ppb.WeightStreamMessage(chunk=chunk)]

    t = {
        "Publish": publish,
        "Fetch": lambda r: [ppb.FetchRequest(replica_id="fuzz", version=0)],
        "Subscribe": lambda r: [ppb.SubscribeRequest(replica_id="fuzz", held_version=0)],
        "ReportVersion": lambda r: [ppb.ReportVersionRequest(replica_id="fuzz", version=1, ok=True, sync_s=0.1)],
    }
    return methods_of(ppb.DESCRIPTOR.services_by_name["ParamSync"], t)


def rollout_methods() -> list[Method]:
    # Pause modes other than in-place would abort the replica's work; all are valid requests.
    t = {"Pause": lambda r: [rpb.PauseRequest(mode=r.choice((1, 2, 3)))]}
    return methods_of(rpb.DESCRIPTOR.services_by_name["RolloutControl"], t)


def _queue_balance(stats) -> int:
    """Groups accepted but in none of the places a group can be: must stay 0."""
    # "malformed" and "missing_version" count pushes refused at the door, never accepted.
    dropped = sum(n for reason, n in stats.dropped_by_reason.items() if reason in ("stale", "max_deliveries"))
    held = stats.queue_size + stats.pending + stats.total_consumed + dropped
    return stats.total_produced - held


async def queue_before(address: str) -> dict:
    from services.queue.client import QueueClient

    rng = random.Random(0)
    async with QueueClient(address) as client:
        await client.push_protos([_group(rng, 10**6 + i) for i in range(KEEP_GROUPS)])
        stats = await client.stats()
        return {"produced": stats.total_produced, "released": (await client.prompt_stats()).total_released}


async def queue_after(address: str, before: dict, tally: Tally) -> None:
    from services.queue.client import QueueClient

    async with QueueClient(address) as client:
        stats = await client.stats()
        # Above 0: accepted groups in no place; below 0 would be a counter counting twice, not a loss.
        if stats.total_produced < before["produced"] or _queue_balance(stats) > 0:
            tally.fail("lost", f"trajectory queue accounting after fuzzing: {stats}")
        prompts = await client.prompt_stats()
        if prompts.total_released < before["released"]:
            tally.fail("lost", f"prompt queue forgot released prompts: {prompts}")
        rng = random.Random(1)
        try:
            await client.push_protos([_group(rng, 2 * 10**6)], timeout_s=5.0)
        except Exception as exc:
            tally.fail("lost", f"a valid push after fuzzing failed: {exc!r}")


async def paramsync_before(address: str) -> dict:
    import torch

    from services.paramsync.client import ParamSyncClient

    async with ParamSyncClient(address, data_plane=False) as client:
        await client.publish(1, {"w": torch.arange(4, dtype=torch.float32)})
        return {"latest": (await client.list_replicas()).latest_version}


async def paramsync_after(address: str, before: dict, tally: Tally) -> None:
    from services.paramsync.client import ParamSyncClient

    async with ParamSyncClient(address, data_plane=False) as client:
        try:
            latest = (await client.list_replicas()).latest_version
            fetched = await client.fetch_version(0)
        except Exception as exc:
            tally.fail("lost", f"a valid fetch after fuzzing failed: {exc!r}")
            return
        if latest < before["latest"] or fetched.manifest.version != latest:
            tally.fail("lost", f"latest version went from {before['latest']} to {latest}")
