"""Tool-call parsers: the text of one assistant turn -> the tool calls it makes.

Signature of every parser::

    fn(text: str) -> list[ToolCall]     # in the order written; [] when the turn calls none

A call the parser cannot read is returned with ``error`` set (the rollout answers it with
an error tool response, and counts it in ``rollout/multi_turn/malformed_calls``).
``rollout.multi_turn.tool_parser`` names the parser: ``hermes`` (the default) or a
``module:function`` plugin.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from verl_mp.reward.registry import load_plugin


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    """Why the call could not be read (then ``name`` may be empty)."""


ToolParser = Callable[[str], list[ToolCall]]

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
_HERMES_BLOCK = re.compile(re.escape(HERMES_OPEN) + r"(.*?)(" + re.escape(HERMES_CLOSE) + r"|$)", re.DOTALL)


def hermes(text: str) -> list[ToolCall]:
    """``<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>``
    blocks (Qwen2.5/Qwen3 and Hermes chat templates); ``arguments`` may also be a JSON string
    of an object. A block that is not closed, not JSON, or lacks a name is a malformed call."""
    calls = []
    for match in _HERMES_BLOCK.finditer(text):
        body, closed = match.group(1).strip(), bool(match.group(2))
        if not closed:
            calls.append(ToolCall("", error=f"{HERMES_OPEN} without {HERMES_CLOSE}"))
            continue
        calls.append(_hermes_call(body))
    return calls


def _hermes_call(body: str) -> ToolCall:
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as err:
        return ToolCall("", error=f"the tool call is not JSON ({err.msg} at character {err.pos})")
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str) or not payload["name"]:
        return ToolCall("", error='the tool call needs {"name": "<tool>", "arguments": {...}}')
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return ToolCall(payload["name"], error="the tool call's arguments are not a JSON object")
    if not isinstance(arguments, dict):
        return ToolCall(payload["name"], error="the tool call's arguments are not a JSON object")
    return ToolCall(payload["name"], arguments)


TOOL_PARSERS: dict[str, ToolParser] = {"hermes": hermes}


def get_tool_parser(name: str, setting: str = "rollout.multi_turn.tool_parser") -> ToolParser:
    """A registered parser or a ``module:function`` plugin; a ValueError names ``setting``."""
    if ":" in name:
        try:
            return load_plugin(name)
        except ValueError as err:
            raise ValueError(f"{setting}={name!r}: {err}") from None
    if name not in TOOL_PARSERS:
        raise ValueError(f"{setting}={name!r} is not a tool-call parser; valid: {sorted(TOOL_PARSERS)} or a "
                         "plugin 'package.module:function'")
    return TOOL_PARSERS[name]
