"""Multi-turn episodes against the real engine process: token-exact recording, masks and turn ends,
the ends of an episode, a slow interaction beside another episode, a weight update mid-episode, and
whole episodes through a replica into the queue.

Interactions stand in for the model's tool calls here: the untrained tiny model never writes a
``<tool_call>``, while an interaction answers every turn, so each test knows its observations.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from relayrl.models.loading import load_tokenizer
from relayrl.schema import PromptSpec
from relayrl.tasks import make_rows
from services.engine.client import EngineClient, GenerateOutput, SamplingParams
from services.paramsync.client import ParamSyncClient
from services.queue.client import QueueClient
from services.queue.config import QueueSettings
from services.queue.server import QueueServer, start_queue_server
from services.rollout.agent.episode import Episode, EpisodeEnv, EpisodeLimits
from services.rollout.agent.execution import ToolExecutor
from services.rollout.agent.interactions import BaseInteraction
from services.rollout.agent.rendering import ObservationRenderer
from services.rollout.generation import SampleResult
from services.rollout.metrics import RolloutMetrics
from tests.integration.rollout.conftest import EngineProcess, queue_overrides
from tests.integration.rollout.replica_harness import (
    bare_weight_sync,
    new_policy,
    paramsync_service,
    pull_groups,
    running_replica,
)
from tests.waiting import wait_until_async

REPO = Path(__file__).resolve().parents[3]
REPLY = "ok"


class EchoInteraction(BaseInteraction):
    """Answers every turn with ``ok`` and a turn score of 0.25; ends after ``end_after`` turns if given."""

    turns: ClassVar[dict[str, int]] = {}

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        self.turns[instance_id] = self.turns.get(instance_id, 0) + 1
        return self.turns[instance_id] == kwargs.get("end_after"), REPLY, 0.25, {}


class GateInteraction(BaseInteraction):
    """Replies only once the test opens ``gate``; ``called`` tells the test it is waiting."""

    called = asyncio.Event()
    gate = asyncio.Event()

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        type(self).called.set()
        await type(self).gate.wait()
        return True, REPLY, 0.0, {}


class RecordingEngine(EngineClient):
    """The real client, keeping each /generate's input ids and what the engine answered."""

    def __init__(self, base_url: str) -> None:
        super().__init__(base_url)
        self.calls: list[tuple[list[int], GenerateOutput]] = []

    async def generate(self, input_ids: Sequence[int], sampling_params: SamplingParams, **kwargs: Any):
        outputs = await super().generate(input_ids, sampling_params, **kwargs)
        self.calls += [(list(input_ids), out) for out in outputs]
        return outputs


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return load_tokenizer(tiny_model_dir)


def _prompt_ids(tokenizer: Any, question: str = "guess 0-6") -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _env(tokenizer: Any, max_turns: int = 3, per_turn: int = 6) -> EpisodeEnv:
    interactions = {"echo": EchoInteraction({}), "gate": GateInteraction({})}
    return EpisodeEnv(
        {},
        interactions,
        ToolExecutor(8, 30.0, 256),
        ObservationRenderer(tokenizer),
        EpisodeLimits(max_turns, per_turn, 1),
    )


def _episode(
    env: EpisodeEnv, client: EngineClient, prompt: list[int], budget: int, version: int, **kwargs: Any
) -> Episode:
    return Episode(
        env,
        client,
        prompt,
        SamplingParams(max_new_tokens=budget, **kwargs.pop("sampling", {})),
        "abort_resume",
        lambda: version,
        "agent-test",
        {"interaction_kwargs": kwargs},
    )


def _expected_observation(tokenizer: Any, turn_ids: list[int]) -> list[int]:
    """Written out by hand for ChatML: the turn's missing close, the user's reply, the assistant opening."""
    close = "\n" if turn_ids[-1] == tokenizer.eos_token_id else "<|im_end|>\n"
    text = f"{close}<|im_start|>user\n{REPLY}<|im_end|>\n<|im_start|>assistant\n"
    return tokenizer(text, add_special_tokens=False)["input_ids"]


async def test_an_episode_records_exactly_the_engines_ids_and_the_observations(
    engine: EngineProcess, tokenizer: Any
) -> None:
    prompt = _prompt_ids(tokenizer)
    async with RecordingEngine(engine.url) as client:
        version = int(await client.weight_version())
        result = await _episode(_env(tokenizer), client, prompt, 200, version, name="echo").run()

    assert len(client.calls) == 3, "three model turns, one request each"
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    turn_ends: list[int] = []
    for turn, (input_ids, out) in enumerate(client.calls):
        assert input_ids == prompt + ids, f"turn {turn} continues the exact sequence so far"
        ids += out.output_ids
        mask += [1] * len(out.output_ids)
        logprobs += out.logprobs
        turn_ends.append(len(ids))
        if turn < 2:
            observation = _expected_observation(tokenizer, out.output_ids)
            ids += observation
            mask += [0] * len(observation)
            logprobs += [0.0] * len(observation)
    assert result.output_ids == ids
    assert result.loss_mask == mask
    assert result.logprobs == logprobs
    assert result.turn_ends == turn_ends
    assert result.versions == [version] * len(ids)
    assert result.token_rewards == [0.25 if i + 1 in turn_ends else 0.0 for i in range(len(ids))]
    assert result.solution_text == client.calls[-1][1].text


@pytest.mark.parametrize(
    ("budget", "end_after", "turns", "finish", "reason"),
    [
        (400, 2, 2, "stop", "interaction"),  # the interaction ends it
        (400, None, 3, "stop", "max_turns"),  # max_assistant_turns
        (35, None, 2, "length", "token_budget"),  # 6 + 23 observation tokens + 6 more fill the budget exactly
        (20, None, 1, "length", "token_budget"),  # no room for the observation and another model token
    ],
)
async def test_an_episode_ends_by_interaction_turns_or_budget(
    engine: EngineProcess, tokenizer: Any, budget: int, end_after: int | None, turns: int, finish: str, reason: str
) -> None:
    env = _env(tokenizer)
    env.metrics = RolloutMetrics()
    async with EngineClient(engine.url) as client:
        version = int(await client.weight_version())
        # ignore_eos: every turn takes its full 6 tokens, so the lengths are known.
        episode = _episode(
            env,
            client,
            _prompt_ids(tokenizer),
            budget,
            version,
            name="echo",
            end_after=end_after,
            sampling={"ignore_eos": True},
        )
        result = await episode.run()
    assert len(result.turn_ends) == turns
    assert len(result.output_ids) == len(result.loss_mask) == len(result.logprobs) == len(result.versions) <= budget
    assert sum(result.loss_mask) == 6 * turns
    assert result.loss_mask[-1] == 1, "an episode ends on a model token"
    assert result.finish_reason == finish, "'length' only when the episode's budget ran out"
    if budget == 35:
        assert len(result.output_ids) == 35
    registry = env.metrics.registry.registry
    ended = {
        s.labels["reason"]: s.value
        for family in registry.collect()
        if family.name == "relayrl_rollout_episodes"
        for s in family.samples
        if s.name.endswith("_total")
    }
    assert ended == {reason: 1.0}, "the episode is counted once, under why it ended"
    assert registry.get_sample_value("relayrl_rollout_episode_turns_sum") == turns


async def test_a_slow_interaction_holds_no_engine_request_and_blocks_no_other_episode(
    engine: EngineProcess, tokenizer: Any
) -> None:
    GateInteraction.called.clear()
    GateInteraction.gate.clear()
    env = _env(tokenizer, max_turns=2)
    busy = {"slow": 0, "fast": 0}
    async with EngineClient(engine.url) as client:
        version = int(await client.weight_version())
        slow_episode = _episode(env, client, _prompt_ids(tokenizer), 200, version, name="gate")
        slow_episode.engine_busy = lambda delta: busy.__setitem__("slow", busy["slow"] + delta)
        slow = asyncio.create_task(slow_episode.run())
        await asyncio.wait_for(GateInteraction.called.wait(), 30)
        assert busy["slow"] == 0, "an episode waiting on its interaction holds no engine request"
        fast_episode = _episode(env, client, _prompt_ids(tokenizer), 200, version, name="echo")
        fast_episode.engine_busy = lambda delta: busy.__setitem__("fast", busy["fast"] + delta)
        fast = await asyncio.wait_for(fast_episode.run(), 30)
        assert len(fast.turn_ends) == 2 and not slow.done()
        GateInteraction.gate.set()
        slowed = await asyncio.wait_for(slow, 30)
    assert len(slowed.turn_ends) == 1
    assert busy == {"slow": 0, "fast": 0}


async def test_an_episode_across_a_weight_update_keeps_per_token_versions(
    engine: EngineProcess, tokenizer: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    async with (
        paramsync_service() as address,
        ParamSyncClient(address) as paramsync,
        EngineClient(engine.url) as client,
    ):
        old = int(await client.weight_version())
        sync, state = bare_weight_sync(paramsync, client, "r-agent", "abort_resume", tmp_path / "weights", old)
        syncing = asyncio.create_task(sync.run())
        episode = _episode(
            _env(tokenizer, max_turns=2, per_turn=150),
            client,
            _prompt_ids(tokenizer),
            400,
            old,
            name="echo",
            sampling={"ignore_eos": True},
        )
        episode.held_version = lambda: state.held_version
        running = asyncio.create_task(episode.run())
        start = (await client.model_info())["generated_tokens"]
        await wait_until_async(lambda: _generated_since(client, start, 20), what="first turn under way")
        await paramsync.publish(old + 1, new_policy(tiny_model_dir, 1.1))
        result: SampleResult = await asyncio.wait_for(running, 60)
        syncing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await syncing
        sync.close()  # its version files live in /dev/shm, not under tmp_path
        assert (await client.update_weights_from_disk(str(tiny_model_dir), weight_version=old + 2)).success

    new = old + 1
    first_end = result.turn_ends[0]
    assert result.turn_ends == [150, len(result.output_ids)] and sum(result.loss_mask) == 300
    assert result.versions == sorted(result.versions), "versions only move forward within an episode"
    assert result.versions[0] == old and result.versions[-1] == new
    assert result.resubmits >= 1, "the interrupted turn was resumed, not restarted"
    observation = range(first_end, len(result.output_ids) - 150)
    assert all(result.versions[i] == result.versions[first_end - 1] for i in observation), (
        "observation tokens carry the version of the model token before them"
    )


async def _generated_since(client: EngineClient, start: int, count: int) -> bool:
    return (await client.model_info())["generated_tokens"] >= start + count


@pytest.fixture
async def queue(redis_server, run_id: str) -> QueueServer:
    server = await start_queue_server(QueueSettings(**queue_overrides(redis_server.url, run_id, lease_timeout_s=5.0)))
    yield server
    await server.stop()


async def test_a_replica_pushes_scored_guess_episodes(
    engine: EngineProcess, queue: QueueServer, tokenizer: Any
) -> None:
    rows = make_rows("guess", 3, seed=0, difficulty=3)
    prompts = [
        PromptSpec(
            prompt_id=f"guess/{i}",
            prompt_token_ids=_prompt_ids(tokenizer, row["prompt"][0]["content"]),
            n_samples=2,
            data_source=row["data_source"],
            ground_truth=row["reward_model"]["ground_truth"],
            extra_info=row["extra_info"],
        )
        for i, row in enumerate(rows)
    ]
    async with EngineClient(engine.url) as client:
        version = int(await client.weight_version())
    async with QueueClient(queue.grpc_address) as q:
        await q.release(prompts)
        async with running_replica(
            engine.url,
            queue.grpc_address,
            replica_id="r-agent",
            max_new_tokens=96,
            multi_turn_enable=True,
            multi_turn_max_assistant_turns=3,
            multi_turn_max_tokens_per_turn=2,
            multi_turn_interaction_config_path=str(REPO / "relayrl" / "tasks" / "guess_interaction.yaml"),
        ):
            groups = await pull_groups(queue.grpc_address, 3, version=version)
    # The episode crosses the queue token-exact: the mask, the turns and the zero log-probs of
    # observation tokens arrive as the replica recorded them.
    for group in groups:
        for sample in group.samples:
            turns = int(sample.reward_extra["episode/turns"])
            text = tokenizer.decode(sample.response_token_ids, skip_special_tokens=False)
            assert 1 <= turns <= 3
            assert text.count("<|im_start|>user\n") == text.count("<|im_start|>assistant\n") == turns - 1
            assert len(sample.behavior_logprobs) == len(sample.response_token_ids) == len(sample.loss_mask)
            assert len(sample.turn_ends) == turns and sample.loss_mask[sample.turn_ends[-1] - 1] == 1
            observation = [i for i, m in enumerate(sample.loss_mask) if m == 0]
            assert (len(observation) > 0) == (turns > 1)
            assert all(sample.behavior_logprobs[i] == 0.0 for i in observation)
            # The reward path scores the last guess; the interaction knows whether the game was won.
            assert sample.reward == sample.reward_extra["interaction/score"]
