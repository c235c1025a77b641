"""``POST /score`` of a real reward process: batching across requests, and bad input refused with a message."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from relayrl import http_client
from services.reward.client import RewardClient
from tests.integration.reward.conftest import RewardProcess


def metric(url: str, name: str) -> float:
    for family in text_string_to_metric_families(http_client.get(f"{url}/metrics", timeout=5).text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    return 0.0


def sequences(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 259) for _ in range(rng.randint(3, 30))] for _ in range(count)]


async def test_concurrent_requests_share_forward_passes_and_score_as_alone(
    start_reward: Callable[..., RewardProcess],
) -> None:
    reward = start_reward(max_batch_size="64", max_wait_ms="200")
    items = sequences(24)
    async with RewardClient(reward.url, timeout_s=60) as client:
        alone = [(await client.score([{"input_ids": ids}]))[0] for ids in items]
        passes_before = metric(reward.url, "relayrl_reward_forward_passes_total")
        together = await asyncio.gather(*(client.score([{"input_ids": ids}]) for ids in items))
    passes = metric(reward.url, "relayrl_reward_forward_passes_total") - passes_before
    # Each alone-request was one pass of one; the same 24 sent at once fill far fewer passes.
    assert passes_before == len(items)
    assert passes <= len(items) // 4
    assert [s[0] for s in together] == pytest.approx(alone, abs=1e-5)
    assert len(set(alone)) == len(alone)


async def test_the_three_item_forms_score_the_same_conversation_alike(
    start_reward: Callable[..., RewardProcess], tiny_rm_dir: Path
) -> None:
    from relayrl.models.loading import load_tokenizer

    tokenizer = load_tokenizer(tiny_rm_dir)
    chat = [{"role": "user", "content": "copy 1"}, {"role": "assistant", "content": "1"}]
    ids = tokenizer(tokenizer.apply_chat_template(chat, tokenize=False), add_special_tokens=False)["input_ids"]
    reward = start_reward()
    async with RewardClient(reward.url, timeout_s=60) as client:
        scores = await client.score([{"messages": chat}, {"prompt": "copy 1", "response": "1"}, {"input_ids": ids}])
    assert scores[0] == pytest.approx(scores[1], abs=1e-6) and scores[0] == pytest.approx(scores[2], abs=1e-6)


@pytest.mark.parametrize(
    ("items", "status", "message"),
    [
        ([{"input_ids": [5, 6]}, {"prompt": "only a prompt"}], 422, "items[1]: Value error, prompt and response go"),
        ([{"input_ids": [5, "x"]}], 422, "items[0].input_ids[1]: Input should be a valid integer"),
        ([{"input_ids": [5], "messages": [{"role": "user", "content": "a"}]}], 422, "items[0]: Value error, give"),
        ([{"input_ids": [5], "extra": 1}], 422, "items[0].extra: Extra inputs are not permitted"),
        ([], 422, "items: List should have at least 1 item"),
        ([{"input_ids": [5]}, {"input_ids": [7, 100000]}], 400, "items[1].input_ids: token 100000 is outside"),
        ([{"input_ids": [5] * 40}], 413, "items[0].input_ids: 40 tokens, more than max_length 32"),
        ([{"input_ids": [5]}] * 9, 413, "items: 9 items, more than max_items_per_request 8"),
    ],
)
async def test_bad_input_is_refused_naming_the_item_and_field(
    bad_input_reward: RewardProcess, items: list[dict[str, Any]], status: int, message: str
) -> None:
    async with http_client.async_client(base_url=bad_input_reward.url) as http:
        response = await http.post("/score", json={"items": items})
        assert response.status_code == status
        assert message in response.json()["detail"]
        # The service keeps serving good requests after bad ones.
        assert (await http.post("/score", json={"items": [{"input_ids": [5, 6]}]})).status_code == 200


@pytest.fixture(scope="module")
def bad_input_reward(tiny_rm_dir: Path) -> Any:
    from relayrl.net import free_port

    env = {"RELAYRL_REWARD_MAX_LENGTH": "32", "RELAYRL_REWARD_MAX_ITEMS_PER_REQUEST": "8"}
    proc = RewardProcess(tiny_rm_dir, free_port(), env).start()
    yield proc
    proc.stop()


async def test_a_judge_scores_through_its_parser(
    start_reward: Callable[..., RewardProcess], tiny_model_dir: Path
) -> None:
    # The random tiny LM writes no verdict, so a pattern that never matches makes every output unparsed.
    judge = start_reward(model_dir=tiny_model_dir, kind="judge", judge_verdict_regex="(?!)", judge_unparsed_score="-7")
    async with http_client.async_client(base_url=judge.url, timeout=60) as http:
        response = await http.post(
            "/score",
            json={"items": [{"prompt": "copy 1", "response": "1"}, {"input_ids": [5, 6, 7], "response_start": 1}]},
        )
    assert response.status_code == 200, response.text
    assert response.json()["scores"] == [-7.0, -7.0] and response.json()["parsed"] == [False, False]
    assert metric(judge.url, "relayrl_reward_unparsed_verdicts_total") == 2
