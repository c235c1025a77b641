import torch

from relayrl.schema import Group, Sample
from services.trainer.batching import collate, gather_response, pack, samples_from_groups, shard


def test_pack_respects_the_padded_token_budget():
    # lengths 5,3,3,2 under 8 padded tokens: [5] alone, the two 3s together, then 2 alone
    assert pack([5, 3, 3, 2], budget=8) == [[0], [1, 2], [3]]


def test_a_sequence_longer_than_the_budget_gets_its_own_micro_batch():
    assert pack([20, 1], budget=8) == [[0], [1]]


def test_shard_deals_longest_first_round_robin():
    assert shard(4, [5, 3, 3, 2], rank=0, world_size=2) == [0, 2]
    assert shard(4, [5, 3, 3, 2], rank=1, world_size=2) == [1, 3]


def test_sequence_reward_sits_on_the_last_token():
    sample = Sample([1, 2], [3, 4, 5], [-1.0] * 3, [2, 2, 3], reward=0.7)
    (ts,) = samples_from_groups([Group("g", "p", [sample])])
    assert ts.token_rewards == [0.0, 0.0, 0.7]
    assert ts.min_version == 2


def test_collate_pads_right_and_marks_responses():
    sample = Sample([1, 2], [3, 4, 5], [-1.0, -2.0, -3.0], [0, 0, 0], reward=1.0)
    short = Sample([9], [8], [-0.5], [0], reward=0.0)
    samples = samples_from_groups([Group("g", "p", [sample, short])])
    mb = collate(samples, [0, 1], pad_id=0)
    assert mb.input_ids_BL.tolist() == [[1, 2, 3, 4, 5], [9, 8, 0, 0, 0]]
    assert mb.mask_BT.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert mb.response_start_B.tolist() == [2, 1]
    # the logits predicting response token t sit at position start + t − 1
    positions = torch.arange(5).float()[None].expand(2, 5)
    assert gather_response(positions, mb.response_start_B, 3).tolist() == [[1, 2, 3], [0, 1, 2]]


def test_pack_keeps_padding_low_on_a_long_tailed_length_mix():
    import math
    import random

    from services.trainer.batching import padding_tokens

    rng = random.Random(0)
    # Prompts of 16–128 tokens, answers log-normal around 64 with a tail to 512.
    lengths = [rng.randint(16, 128) + min(512, int(rng.lognormvariate(math.log(64), 0.9))) for _ in range(256)]
    for budget in (2048, 4096, 16384):
        bins = pack(lengths, budget)
        assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
        assert all(len(b) == 1 or len(b) * max(lengths[i] for i in b) <= budget for b in bins)
        padding, total = padding_tokens(lengths, bins)
        assert padding / total < 0.15, (budget, padding / total)
    # One micro-batch padded to the longest wastes most of its compute on this mix.
    padding, total = padding_tokens(lengths, [list(range(len(lengths)))])
    assert padding / total > 0.5
