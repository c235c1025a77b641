"""A tiny model taught to answer chosen questions with chosen text, so a test can see the real
engine write what an untrained model never does (Hermes ``<tool_call>`` blocks).

Nothing is faked: the model is the tiny Qwen2 of the test session, fine-tuned for a few hundred
steps until greedy decoding (temperature 0) gives each answer exactly, and saved in the Hugging
Face format the engine serves. Teaching takes seconds on one CPU core.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relayrl.models.loading import load_causal_lm, load_tokenizer, save_hf_dir


def chat_prompt_ids(tokenizer: Any, question: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def teach(base_dir: Path, out_dir: Path, lessons: list[tuple[list[int], str]], max_steps: int = 1500) -> Path:
    """Writes to ``out_dir`` the model of ``base_dir`` fine-tuned to continue each lesson's prompt
    ids with its text (end token included)."""
    import torch

    torch.manual_seed(0)
    tokenizer = load_tokenizer(base_dir)
    model = load_causal_lm(base_dir)
    model.train()
    pairs = [(prompt, list(tokenizer(text, add_special_tokens=False)["input_ids"])) for prompt, text in lessons]
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(max_steps):
        total = 0.0
        for prompt, answer in pairs:
            labels = [-100] * len(prompt) + answer
            loss = model(input_ids=torch.tensor([prompt + answer]), labels=torch.tensor([labels])).loss
            loss.backward()
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad()
        # Summed cross-entropy this low leaves every answer token far ahead of the next best.
        if total < 0.01 * len(pairs):
            break
    model.eval()
    with torch.no_grad():
        for prompt, answer in pairs:
            out = model.generate(torch.tensor([prompt]), max_new_tokens=len(answer), do_sample=False)
            if out[0, len(prompt) :].tolist() != answer:
                raise RuntimeError(f"the model did not learn {tokenizer.decode(answer)!r} in {max_steps} steps")
    save_hf_dir(model, base_dir, out_dir)
    return out_dir
