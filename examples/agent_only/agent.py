"""An agent that trains the policy it talks to: agent-only training (docs/agent-only.md).

Each episode is one conversation with the rollout's OpenAI endpoint through the ``openai``
client: the user asks for a number, the model answers, the user asks it to repeat, the model
answers again. The agent scores the episode itself (1.0 when the last answer contains the number)
and finishes it; ``--group-size`` episodes of one task form one trajectory group, which the trainer
trains on as GRPO's group. The last finish of a group answers with the group's trajectory id and
its place in the queue; ``relayrl ctl group <group_id>`` tells later whether it was trained.

    python examples/agent_only/agent.py --base-url http://127.0.0.1:PORT --api-key TOKEN --groups 3

The rollout's URL and the token are in ``runs/<id>/ctl.env`` (``RELAYRL_CTL_ROLLOUT_URLS``,
``RELAYRL_API_TOKEN``). One JSON line per group is printed.
"""

from __future__ import annotations

import argparse
import json
import uuid

import httpx
import openai


def episode(client: openai.OpenAI, conversation_id: str, group_id: str, group_size: int, number: int) -> float:
    """One conversation of two turns; returns its reward."""
    headers = {"X-RelayRL-Conversation-Id": conversation_id}
    # Strings: OpenAI's metadata holds strings; the endpoint reads group_size as an integer.
    metadata = {"group_id": group_id, "group_size": str(group_size)}
    messages: list[dict] = [{"role": "user", "content": f"Say the number {number}."}]
    for follow_up in ("Once more, please.", None):
        reply = client.chat.completions.create(
            model="policy", messages=messages, max_tokens=8, extra_headers=headers, metadata=metadata
        )
        messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
        if follow_up:
            messages.append({"role": "user", "content": follow_up})
    return float(str(number) in messages[-1]["content"])


def play_group(client: openai.OpenAI, http: httpx.Client, group_size: int, number: int) -> dict:
    """``group_size`` episodes of one task, each finished with its reward; returns the last finish's answer."""
    group_id = f"say-{number}-{uuid.uuid4().hex[:8]}"
    answer: dict = {}
    for member in range(group_size):
        conversation_id = f"{group_id}-{member}"
        reward = episode(client, conversation_id, group_id, group_size, number)
        finished = http.post(f"/v1/conversations/{conversation_id}/finish", json={"reward": reward})
        finished.raise_for_status()
        answer = finished.json()
    return answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True, help="The rollout's HTTP URL, e.g. http://127.0.0.1:8080.")
    parser.add_argument("--api-key", default="none", help="The deployment's RELAYRL_API_TOKEN.")
    parser.add_argument("--groups", type=int, default=3, help="Trajectory groups to push.")
    parser.add_argument("--group-size", type=int, default=2, help="Episodes per group (GRPO's group).")
    args = parser.parse_args()
    base = args.base_url.rstrip("/")
    # The endpoint answers 503 with Retry-After while its replica is paused: the client waits and retries.
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=args.api_key, max_retries=5)
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {args.api_key}"}, timeout=60) as http:
        for number in range(args.groups):
            answer = play_group(client, http, args.group_size, number % 10)
            print(json.dumps({k: answer.get(k) for k in ("group_id", "status", "trajectory_id", "queue_position")}))


if __name__ == "__main__":
    main()
