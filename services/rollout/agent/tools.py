"""Tools the way verl users write them.

A tool-config YAML lists tools by class::

    tools:
      - class_name: relayrl.tasks.calculator.CalculatorTool
        config: {type: native}
        tool_schema:
          type: function
          function:
            name: calculator
            description: Evaluates an arithmetic expression.
            parameters:
              type: object
              properties: {expression: {type: string, description: "e.g. 12*34"}}
              required: [expression]

Each class takes ``(config: dict, tool_schema: ToolSchema)`` and has verl's async methods
``create(instance_id, **create_kwargs) -> str``, ``execute(instance_id, parameters, **execute_kwargs)
-> (text, step_reward, metrics)``, ``calc_reward(instance_id, **calc_reward_kwargs) -> float`` and
``release(instance_id, **release_kwargs)``. Per-sample keyword arguments come from the row's
``extra_info.tools_kwargs[<tool name>]`` (``create_kwargs``, ``execute_kwargs``,
``calc_reward_kwargs``, ``release_kwargs``). ``execute`` must not block the event loop: a
blocking tool wraps its work in ``asyncio.to_thread``.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from services.rollout.agent.loading import import_class, read_yaml


class FunctionSchema(BaseModel):
    name: str = Field(min_length=1)
    description: str = ""
    # A JSON schema object, as in OpenAI's function-calling API.
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ToolSchema(BaseModel):
    """OpenAI's function tool schema (verl's ``OpenAIFunctionToolSchema``)."""

    type: Literal["function"] = "function"
    function: FunctionSchema


class BaseTool:
    """A tool with one state per episode (``instance_id``); subclasses override ``execute`` at least."""

    def __init__(self, config: dict[str, Any], tool_schema: ToolSchema) -> None:
        self.config = config
        self.tool_schema = tool_schema
        self.name = tool_schema.function.name

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> str:
        return instance_id or uuid.uuid4().hex

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[str, float, dict]:
        raise NotImplementedError(f"tool {self.name!r} does not implement execute")

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        return None


def load_tools(path: str | Path) -> dict[str, Any]:
    """The tools of a tool-config YAML, by their schema's function name."""
    tools: dict[str, Any] = {}
    for i, entry in enumerate(read_yaml(path, "tools")):
        where = f"{path}: tools[{i}]"
        if "class_name" not in entry:
            raise ValueError(f"{where} has no class_name")
        try:
            schema = ToolSchema.model_validate(entry.get("tool_schema") or {})
        except ValidationError as exc:
            raise ValueError(f"{where}.tool_schema: {exc}") from exc
        tool = import_class(entry["class_name"])(dict(entry.get("config") or {}), schema)
        for method in ("create", "execute", "calc_reward", "release"):
            if not callable(getattr(tool, method, None)):
                raise ValueError(f"{where}: {entry['class_name']} has no {method}()")
        if schema.function.name in tools:
            raise ValueError(f"{where}: a second tool named {schema.function.name!r}")
        tools[schema.function.name] = tool
    return tools
