"""Builders shared by the queue integration tests."""

from __future__ import annotations

from relayrl.schema import Group, Sample


def make_group(i: int, version: int = 0, samples: int = 2, tokens: int = 3, is_eval: bool = False) -> Group:
    return Group(
        group_id=f"g{i}",
        prompt_id=f"ds/{i}",
        samples=[
            Sample(
                prompt_token_ids=[1, 2, 3],
                response_token_ids=[4 + j for j in range(tokens)],
                behavior_logprobs=[-0.5] * tokens,
                policy_versions=[version] * tokens,
                reward=float(i),
            )
            for _ in range(samples)
        ],
        is_eval=is_eval,
    )
