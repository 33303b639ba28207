"""Tools a multi-turn rollout lets the model call: a registry, like reward functions.

Signature of every tool::

    fn(arguments: dict) -> str      # what the model reads back (other values: str(value))

A tool that raises answers with an error tool response (the model reads ``error: ...``);
tools run in the reward functions' sandboxed worker pool (`verl_mp.reward.tool_pool`).
``rollout.multi_turn.tools`` names them: a built-in (``calculator``, ``python``) or
``name=package.module:function`` / ``name=/path/file.py:function`` (a plugin that the
model calls as ``name``).
"""

from __future__ import annotations

import ast
import operator
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from verl_mp.reward.registry import load_plugin

ToolFn = Callable[[dict[str, Any]], Any]

TOOLS: dict[str, ToolFn] = {}
"""Built-in tools and those added with `register_tool`."""


def register_tool(name: str) -> Callable[[ToolFn], ToolFn]:
    """Decorator adding a tool under ``name``; a duplicate name raises."""

    def decorator(fn: ToolFn) -> ToolFn:
        if name in TOOLS:
            raise ValueError(f"tool '{name}' is already registered ({TOOLS[name].__module__}); pick another name")
        TOOLS[name] = fn
        return fn

    return decorator


def resolve_tools(specs: list[str], setting: str = "rollout.multi_turn.tools") -> dict[str, ToolFn]:
    """``{name the model calls: function}`` from ``setting``'s entries (``calculator`` or
    ``name=module:function``); a ValueError names the entry and the fix."""
    tools: dict[str, ToolFn] = {}
    for spec in specs:
        name, sep, impl = spec.partition("=")
        name, impl = name.strip(), (impl.strip() if sep else name.strip())
        if not name or not impl:
            raise ValueError(f"{setting}: entry {spec!r} must be a built-in name ({sorted(TOOLS)}) or "
                             "name=module:function")
        if name in tools:
            raise ValueError(f"{setting}: tool name {name!r} is given twice")
        if ":" in impl:
            try:
                tools[name] = load_plugin(impl)
            except ValueError as err:
                raise ValueError(f"{setting}: entry {spec!r}: {err}") from None
        elif impl in TOOLS:
            tools[name] = TOOLS[impl]
        else:
            raise ValueError(f"{setting}: unknown tool {impl!r}; built-ins: {sorted(TOOLS)}, or a plugin "
                             "name=package.module:function")
    return tools


# -- calculator ------------------------------------------------------------------------------------
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPRESSION_CHARS = 256
MAX_EXPONENT = 64
MAX_RESULT_DIGITS = 100


def evaluate_arithmetic(expression: str) -> int | float:
    """Evaluate ``+ - * / // % **`` and parentheses over int and float literals; anything
    else (names, calls, attributes, strings) is a ValueError. Nothing is ``eval``-ed."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise ValueError(f"not an arithmetic expression: {err.msg}") from None
    return _eval(tree.body)


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is larger than {MAX_EXPONENT}")
        value = _BINARY[type(node.op)](left, right)
        if isinstance(value, int) and abs(value) >= 10**MAX_RESULT_DIGITS:
            raise ValueError(f"result has more than {MAX_RESULT_DIGITS} digits")
        if isinstance(value, complex):
            raise ValueError("complex result")
        return value
    raise ValueError(f"only numbers and + - * / // % ** are allowed, not {type(node).__name__}")


@register_tool("calculator")
def calculator(arguments: dict[str, Any]) -> str:
    """``{"expression": "374*812"}`` -> ``"303688"`` (integers exactly; a float result is
    printed with repr, an integral one as an integer)."""
    expression = _argument(arguments, "expression", "calculator")
    value = evaluate_arithmetic(str(expression))
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    return str(value)


# -- python ------------------------------------------------------------------------------------------
PYTHON_OUTPUT_CHARS = 4096
"""Output kept from a program (the rollout cuts tool responses to
``rollout.multi_turn.max_tool_response_tokens`` tokens too)."""


@register_tool("python")
def python(arguments: dict[str, Any]) -> str:
    """``{"code": "print(2**10)"}`` -> its standard output (and standard error when it
    fails), from a fresh isolated interpreter (``python -I``, empty environment but PATH, a
    temporary working directory). The worker's limits and timeout cover it: a program
    still running when the tool times out is killed with the worker's process group."""
    code = _argument(arguments, "code", "python")
    with tempfile.TemporaryDirectory(prefix="verl_mp_tool_") as cwd:
        proc = subprocess.run([sys.executable, "-I", "-c", str(code)], cwd=cwd, capture_output=True, text=True,
                              env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, stdin=subprocess.DEVNULL)
    out = proc.stdout if proc.returncode == 0 else proc.stdout + proc.stderr
    return out[:PYTHON_OUTPUT_CHARS]


def _argument(arguments: dict[str, Any], key: str, tool: str) -> Any:
    if not isinstance(arguments, dict) or key not in arguments:
        got = sorted(arguments) if isinstance(arguments, dict) else type(arguments).__name__
        raise ValueError(f"{tool} needs the argument '{key}' (got {got})")
    return arguments[key]
