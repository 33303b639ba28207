"""Tools, a tool-call parser and a reward for multi-turn tests, loaded by ``module:function``.

The test models have random weights and write random text, so `scripted_parser` decides what
a turn "does" from the text itself (the sum of its bytes): answer, call the calculator, write
a malformed call, call an unknown tool, a tool that raises, one that hangs, or one whose
answer is too long. Every turn of a seeded run is then one of these, deterministically, and
each of them occurs in a run of a few dozen turns.
"""

import time

from verl_mp.reward.tool_parser import ToolCall, hermes

SCENARIOS = ("answer", "calc", "malformed", "unknown", "raises", "hangs", "long", "calc2")
TOOLS = ["calculator", "boom=tests.e2e.agent_plugins:boom", "hang=tests.e2e.agent_plugins:hang",
         "echo=tests.e2e.agent_plugins:echo"]
"""``rollout.multi_turn.tools`` for `scripted_parser`."""


def scenario(text: str) -> str:
    return SCENARIOS[sum(text.encode()) % len(SCENARIOS)]


def scripted_parser(text: str) -> list[ToolCall]:
    kind = scenario(text)
    if kind == "answer":
        return []
    if kind == "calc":
        return [ToolCall("calculator", {"expression": f"{len(text)}*7"})]
    if kind == "calc2":  # two calls in one turn
        return [ToolCall("calculator", {"expression": f"{len(text)}+1"}), ToolCall("calculator", {"expression": "2*3"})]
    if kind == "malformed":
        return hermes('<tool_call>{"name": "calculator", "arguments": </tool_call>')
    if kind == "unknown":
        return [ToolCall("abacus", {"expression": "1+1"})]
    if kind == "raises":
        return [ToolCall("boom", {})]
    if kind == "hangs":
        return [ToolCall("hang", {})]
    return [ToolCall("echo", {"text": "ab " * 400})]


def boom(arguments):
    raise RuntimeError("the tool failed on purpose")


def hang(arguments):
    time.sleep(300)


def echo(arguments):
    return arguments["text"]


def turns_reward(data_source, solution_str, ground_truth, extra_info=None, trajectory=None):
    """Rewards using tools: 1 per successful tool response, at most 1 (reads the trajectory)."""
    if trajectory is None:
        raise AssertionError("the reward function did not receive the trajectory")
    ok = sum(m["role"] == "tool" and m["status"] == "ok" for m in trajectory["messages"])
    return {"score": min(1.0, float(ok)), "tool_ok": float(ok), "turns": float(trajectory["num_turns"])}
