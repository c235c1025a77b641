"""What crosses ``POST /score``: a batch of items in, one score per item out, in order.

An item is one of three forms (exactly one):

- ``{"messages": [{"role": ..., "content": ...}, ...]}``: a conversation whose last message is
  the response; rendered with the model's chat template, or, for a tokenizer without one, as
  ``"<role>: <content>\\n"`` per message (the plain rendering);
- ``{"prompt": str, "response": str}``: the same as ``messages`` of one user turn and one
  assistant turn;
- ``{"input_ids": [...]}``: token ids as they are (they must be of the reward model's
  vocabulary); ``response_start`` marks where the response begins, which the judge needs to
  tell prompt from response (without it the judge sees all of it as the response).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: str = Field(min_length=1)
    content: str


class ScoreItem(BaseModel):
    model_config = ConfigDict(extra="forbid")

    messages: list[ChatMessage] | None = Field(None, min_length=1)
    prompt: str | None = None
    response: str | None = None
    input_ids: list[int] | None = Field(None, min_length=1)
    response_start: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _one_form(self) -> ScoreItem:
        forms = [self.messages is not None, self.prompt is not None or self.response is not None, self.input_ids]
        if sum(bool(f) for f in forms) != 1:
            raise ValueError("give exactly one of messages, prompt + response, or input_ids")
        if (self.prompt is None) != (self.response is None):
            raise ValueError("prompt and response go together: give both")
        if self.response_start is not None and self.input_ids is None:
            raise ValueError("response_start goes with input_ids")
        if self.response_start is not None and self.input_ids and self.response_start > len(self.input_ids):
            raise ValueError(f"response_start {self.response_start} is past the {len(self.input_ids)} input_ids")
        return self

    def conversation(self) -> list[dict[str, Any]]:
        """The item as chat messages (``input_ids`` items have none)."""
        if self.messages is not None:
            return [m.model_dump() for m in self.messages]
        return [{"role": "user", "content": self.prompt}, {"role": "assistant", "content": self.response}]


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    items: list[ScoreItem] = Field(min_length=1)


class ScoreResponse(BaseModel):
    scores: list[float] = Field(description="One score per item, in the request's order.")
    parsed: list[bool] | None = Field(
        None, description="judge only: False where the output held no verdict (its score is the fallback)."
    )
    model: str = Field(description="The model directory that scored.")
