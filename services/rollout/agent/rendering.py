"""Observation messages as exact token ids, through the model's own chat template.

The model's tokens are never decoded and re-encoded: an observation is the template's text for
the new messages (tool results, the interaction's reply) and the opened assistant turn, tokenized
on its own and appended after the model's ids. The template renders those messages after a fixed
base conversation, and the base's text is cut off, which is how a template that inserts a default
system prompt (Qwen2.5's) still gives the messages' text alone. The end of the model's turn (the
template's text after an assistant message, ``<|im_end|>\\n`` in ChatML) is completed from the
model's last tokens: only what the model did not write itself is added, masked.
"""

from __future__ import annotations

from typing import Any

_BASE = [{"role": "user", "content": "base"}]
# A content no template writes itself, to find where an assistant message's text ends.
_SENTINEL = "\x00relayrl-turn\x00"


class ObservationRenderer:
    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._base_text = self._render(_BASE, add_generation_prompt=False)
        with_turn = self._render([*_BASE, {"role": "assistant", "content": _SENTINEL}], add_generation_prompt=False)
        # The template's closing of an assistant turn, e.g. "<|im_end|>\n".
        self.turn_close_ids = self._encode(with_turn[with_turn.index(_SENTINEL) + len(_SENTINEL) :])

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return self._tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _encode(self, text: str) -> list[int]:
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def observation_ids(self, messages: list[dict[str, Any]], turn_ids: list[int]) -> list[int]:
        """The ids after a model turn ``turn_ids``: its missing close, ``messages``, the next assistant opening."""
        text = self._render([*_BASE, *messages], add_generation_prompt=True)
        if not text.startswith(self._base_text):
            raise ValueError("the chat template does not render messages after the base conversation unchanged")
        return self._missing_close(turn_ids) + self._encode(text[len(self._base_text) :])

    def _missing_close(self, turn_ids: list[int]) -> list[int]:
        """The part of the turn's close the model did not generate (all of it after a cut-off turn)."""
        close = self.turn_close_ids
        for written in range(len(close), 0, -1):
            if turn_ids[-written:] == close[:written]:
                return close[written:]
        return list(close)

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=False)
