"""The configuration reference, read from the settings classes themselves.

Every pydantic-settings class in ``relayrl/``, ``services/`` and ``commands/`` is found by
reading the sources (a class whose bases name a ``*Settings`` class), so a settings class added
anywhere appears without a change here. For each field: its environment variable, its key in
the stack YAML, its type with bounds, its default, its description, and the name verl, SGLang,
ROLL or AReaL gives it where the description records one ("verl's name", "verl rollout.n",
"SGLang's max_prefill_tokens").
"""

from __future__ import annotations

import ast
import html
import importlib
import re
import types
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

from commands.stack.config import SERVICE_SECTIONS, CustomRewardFunction, StackSettings
from relayrl.config import ServiceSettings, env_var_name

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("relayrl", "services", "commands")
SKIP = ("relayrl/v1",)
ORDER = ("queue", "paramsync", "engine", "rollout", "trainer", "reward", "sft")
SYSTEMS = "verl|SGLang|ROLL|AReaL"
# "verl's name" / "SGLang's name": the field is named as that system names it.
SAME_NAME = re.compile(rf"\b({SYSTEMS})'s name\b|\(({SYSTEMS})\)")
# "verl rollout.n", "verl's max_queue_size", "(ROLL topr_positive_weight)": a dotted or snake_case name.
OTHER_NAME = re.compile(rf"\b({SYSTEMS})(?:'s)? ((?:[a-z][a-z0-9]*[._])+[a-z0-9]+)\b")


def settings_modules() -> list[str]:
    """Modules that define a settings class, found in the sources without importing them."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(SKIP):
                continue
            tree = ast.parse(path.read_text())
            bases = [
                base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
                for node in tree.body
                if isinstance(node, ast.ClassDef)
                for base in node.bases
            ]
            if any(name.endswith("Settings") for name in bases):
                found.append(rel.removesuffix(".py").removesuffix("/__init__").replace("/", "."))
    return found


def settings_classes() -> list[type[BaseSettings]]:
    classes = []
    for name in settings_modules():
        module = importlib.import_module(name)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseSettings)
                and value.__module__ == module.__name__
                and value is not ServiceSettings
            ):
                classes.append(value)

    def rank(cls: type[BaseSettings]) -> tuple[int, str]:
        service = getattr(cls, "service_name", "")
        return (ORDER.index(service) if service in ORDER else len(ORDER), cls.__name__)

    return sorted(classes, key=rank)


def type_name(tp: Any, nested: bool = False) -> str:
    origin = get_origin(tp)
    if origin is Annotated:
        inner, *extra = get_args(tp)
        metadata = [m for item in extra for m in (item.metadata if isinstance(item, FieldInfo) else [item])]
        shown = bounds(metadata)
        if nested and shown:  # one item of a tuple or list: its bounds in parentheses, not among the items
            return f"{type_name(inner)} ({', '.join(shown)})"
        return ", ".join([type_name(inner), *shown])
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " \\| ".join(type_name(a) for a in get_args(tp))
    if origin is not None:
        args = ", ".join(type_name(a, nested=True) for a in get_args(tp))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if tp is type(None):
        return "null"
    if tp is SecretStr:
        return "secret"
    if isinstance(tp, type):
        if issubclass(tp, Path):
            return "path"
        return {"str": "string"}.get(tp.__name__, tp.__name__)
    return str(tp)


def bounds(metadata: list[Any]) -> list[str]:
    shown = []
    for item in metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            if isinstance(item, getattr(annotated_types, attr.capitalize())):
                shown.append(f"{sign} {getattr(item, attr)}")
        if getattr(item, "pattern", None):
            shown.append(f"matches {code(item.pattern)}")
        if isinstance(item, annotated_types.MinLen) and item.min_length:
            shown.append(f"length ≥ {item.min_length}")
    return shown


def default_of(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
    elif info.default is PydanticUndefined:
        return "required"
    else:
        value = info.default
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, BaseModel):
        value = value.model_dump()
    if value is None or value == "":
        return "empty"
    if isinstance(value, bool):
        return code(str(value).lower())
    return code(value)


def known_names(field: str, description: str) -> str:
    names = [f"{a or b}: `{field}`" for a, b in SAME_NAME.findall(description)]
    for system, name in OTHER_NAME.findall(description):
        entry = f"{system}: `{name}`"
        if entry not in names:
            names.append(entry)
    return "<br>".join(names)


def code(text: object) -> str:
    """Inline code that survives a Markdown table: HTML-escaped, pipes as entities."""
    return "<code>" + html.escape(str(text), quote=False).replace("|", "&#124;") + "</code>"


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def field_row(
    cls: type[BaseModel], name: str, info: FieldInfo, yaml_key: str, env: bool = True, last: str | None = None
) -> str:
    description = info.description or ""
    kind = ", ".join([type_name(info.annotation), *bounds(info.metadata)])
    variable = f"`{env_var_name(cls, name)}`" if env else "–"  # type: ignore[arg-type]
    yaml = f"`{yaml_key}`" if yaml_key else "–"
    return (
        f"| {variable} | {yaml} | {kind} | {default_of(info)} | {cell(description)} |"
        f" {known_names(name, description) if last is None else last} |"
    )


HEAD = (
    "| variable | YAML key | type | default | meaning | verl / SGLang / ROLL name |\n"
    "| --- | --- | --- | --- | --- | --- |"
)


def is_shared(cls: type[BaseSettings], name: str) -> bool:
    prefix = str(cls.model_config.get("env_prefix", ""))
    return not env_var_name(cls, name).startswith(prefix) if prefix else False


def label(cls: type[BaseSettings]) -> str:
    """The service's name, or for other settings the word after ``RELAYRL_`` in their prefix."""
    service = getattr(cls, "service_name", "")
    return service or str(cls.model_config.get("env_prefix", "")).removeprefix("RELAYRL_").strip("_").lower()


def shared_section(classes: list[type[BaseSettings]]) -> list[str]:
    seen: dict[str, tuple[type[BaseSettings], str, list[str]]] = {}
    for cls in classes:
        for name in cls.model_fields:
            if is_shared(cls, name):
                variable = env_var_name(cls, name)
                readers = seen.setdefault(variable, (cls, name, []))[2]
                readers.append(label(cls))
    rows = []
    for _variable, (cls, name, readers) in sorted(seen.items()):
        yaml = f"stack.{name}" if name in StackSettings.model_fields else ""
        rows.append(field_row(cls, name, cls.model_fields[name], yaml, last=", ".join(sorted(set(readers)))))
    head = HEAD.replace("verl / SGLang / ROLL name", "read by")
    return [
        "## Shared by every service",
        "",
        "One unprefixed variable sets these in every service that reads them, so the services agree.",
        "",
        head,
        *rows,
        "",
    ]


def service_section(cls: type[BaseSettings]) -> list[str]:
    service = label(cls)
    section = service if service in SERVICE_SECTIONS else ""
    prefix = str(cls.model_config.get("env_prefix", ""))
    title = f"{service} (`{prefix}*`)"
    doc = (cls.__doc__ or "").strip().split("\n\n")[0]
    where = (
        f"In the stack YAML these are the keys of the `{section}:` section."
        if section
        else "Not a section of the stack YAML: set them in the environment."
    )
    rows = [
        field_row(cls, name, info, f"{section}.{name}" if section else "")
        for name, info in cls.model_fields.items()
        if not is_shared(cls, name)
    ]
    intro = [cell(doc), ""] if doc and not doc.startswith("Fields every service has") else []
    return [f"## {title}", "", f"`{cls.__module__}.{cls.__name__}`. {where}", "", *intro, HEAD, *rows, ""]


def stack_section() -> list[str]:
    rows = [
        field_row(StackSettings, name, info, f"stack.{name}", env=False)
        for name, info in StackSettings.model_fields.items()
    ]
    rows += [
        field_row(CustomRewardFunction, name, info, f"custom_reward_function.{name}", env=False)
        for name, info in CustomRewardFunction.model_fields.items()
    ]
    sections = ", ".join(f"`{s}:`" for s in SERVICE_SECTIONS)
    return [
        "## The stack YAML (`relayrl up --config FILE`)",
        "",
        "The file has a `stack:` section (below), verl's optional `custom_reward_function:`, and one"
        f" section per service ({sections}) whose keys are that service's settings in the tables on"
        " this page: `trainer: {total_steps: 50}` is `RELAYRL_TRAINER_TOTAL_STEPS=50`. `relayrl check"
        " --config FILE` validates every section with the service's own settings class before anything"
        " starts.",
        "",
        HEAD,
        *rows,
        "",
    ]


def render() -> str:
    classes = settings_classes()
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by `python -m docs.gen` from the settings classes; do not edit by hand. -->",
        "",
        "Every service reads one typed settings class from environment variables: `RELAYRL_<SERVICE>_<FIELD>`"
        " for its own fields and the unprefixed `RELAYRL_<FIELD>` for the values every service must agree on."
        " A bad value fails at start-up with one message naming the variable. The local stack's YAML sets"
        " the same fields by section. Where verl, SGLang, ROLL or AReaL has a name for a setting, the last"
        " column gives it; [Concepts](../concepts.md#staleness-in-the-names-you-know) maps the staleness"
        " settings of each onto η.",
        "",
        *stack_section(),
        *shared_section(classes),
    ]
    for cls in classes:
        lines += service_section(cls)
    return "\n".join(lines).rstrip() + "\n"
