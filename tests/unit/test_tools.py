"""Tools of multi-turn rollouts: the calculator evaluates arithmetic and nothing else, the
Hermes parser reads good calls and names what is wrong with bad ones, and the tool pool
(the reward functions' sandboxed workers, driven call by call) turns a raising, hanging or
dying tool into an error result without holding back the calls submitted after it."""

import os
import time

import pytest

from verl_mp.reward.tool_parser import ToolCall, get_tool_parser, hermes
from verl_mp.reward.tool_pool import ToolPool
from verl_mp.reward.tools import TOOLS, calculator, evaluate_arithmetic, resolve_tools

pytestmark = pytest.mark.unit

PLUGIN = '''
import os, signal, time

def echo(arguments):
    return arguments["text"]

def boom(arguments):
    raise RuntimeError("tool exploded")

def hang(arguments):
    signal.signal(signal.SIGALRM, signal.SIG_IGN)  # like C code that never returns to Python
    time.sleep(300)

def die(arguments):
    os._exit(3)

def secrets(arguments):
    return ",".join(sorted(k for k in os.environ if k in ("HF_TOKEN", "WANDB_API_KEY")) or ["none"])
'''


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    path = tmp_path_factory.mktemp("tools") / "my_tools.py"
    path.write_text(PLUGIN)
    return str(path)


@pytest.mark.parametrize("expression, expected", [
    ("374*812", "303688"), ("(2+3)*4", "20"), ("-7 // 2", "-4"), ("10/4", "2.5"), ("6/3", "2"),
    ("2**10 % 1000", "24"), (" 999 * 999 ", "998001"), ("1.5e3 + 1", "1501")])
def test_calculator(expression, expected):
    assert calculator({"expression": expression}) == expected


@pytest.mark.parametrize("expression", [
    "__import__('os').system('true')", "x + 1", "len('abc')", "(1).real", "'a' * 3", "2 ** 1000",
    "[1, 2]", "1 if 1 else 2", "9" * 300, "10**99 * 10**99"])
def test_calculator_refuses_everything_but_arithmetic(expression):
    with pytest.raises(ValueError):
        evaluate_arithmetic(expression)


def test_calculator_names_a_missing_argument():
    with pytest.raises(ValueError, match="'expression'"):
        calculator({"expr": "1+1"})


def test_hermes_parser():
    text = ('Let me compute. <tool_call>{"name": "calculator", "arguments": {"expression": "3*4"}}</tool_call>\n'
            '<tool_call>\n{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}\n</tool_call>')
    assert hermes(text) == [ToolCall("calculator", {"expression": "3*4"}), ToolCall("python", {"code": "print(1)"})]
    assert hermes("#### 12") == []
    bad = hermes('<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>'
                 '<tool_call>{"arguments": {}}</tool_call><tool_call>{"name": "c", "arguments": [1]}</tool_call>'
                 '<tool_call>{"name": "c"')
    assert [c.error is not None for c in bad] == [True] * 4
    assert "not JSON" in bad[0].error and "name" in bad[1].error and "object" in bad[2].error
    assert "without </tool_call>" in bad[3].error
    assert get_tool_parser("hermes") is hermes
    with pytest.raises(ValueError, match="rollout.multi_turn.tool_parser='nope'"):
        get_tool_parser("nope")


def test_resolve_tools(plugin):
    tools = resolve_tools(["calculator", f"shout={plugin}:echo"])
    assert tools["calculator"] is TOOLS["calculator"] and tools["shout"]({"text": "hi"}) == "hi"
    with pytest.raises(ValueError, match="rollout.multi_turn.tools: unknown tool 'abacus'"):
        resolve_tools(["abacus"])
    with pytest.raises(ValueError, match="given twice"):
        resolve_tools(["calculator", "calculator"])
    with pytest.raises(ValueError, match="no function 'missing'"):
        resolve_tools([f"x={plugin}:missing"])


def _drain(pool, keys, limit_s=30.0):
    results, start = {}, time.monotonic()
    while set(results) != set(keys):
        assert time.monotonic() - start < limit_s, f"tool pool stalled; have {sorted(results)}"
        for key, result in pool.poll(0.5):
            results[key] = (result, time.monotonic() - start)
    return results


def test_tool_pool_contains_bad_tools(plugin, monkeypatch):
    """A raising tool, one that ignores its alarm and hangs, and one that kills its worker are
    answered as errors/timeouts; the good calls submitted after the hanging one come back long
    before its timeout (no barrier), and the workers never see the trainer's secrets."""
    monkeypatch.setenv("HF_TOKEN", "secret")
    tools = resolve_tools([f"echo={plugin}:echo", f"boom={plugin}:boom", f"hang={plugin}:hang",
                           f"die={plugin}:die", f"secrets={plugin}:secrets", "calculator", "python"])
    pool = ToolPool(num_workers=2, timeout_s=3.0, kill_grace_s=0.5)
    try:
        pool.start()  # as a rollout does when it is built
        assert len(pool._workers) == 2 and pool.in_flight == 0
        pool.submit("hang", tools["hang"], {})
        for i in range(6):
            pool.submit(f"echo{i}", tools["echo"], {"text": f"hi {i}"})
        for key in ("boom", "die", "secrets"):
            pool.submit(key, tools[key], {})
        pool.submit("calc", tools["calculator"], {"expression": "374*812"})
        pool.submit("py", tools["python"], {"code": "import os; print(2**10, 'HF_TOKEN' in os.environ, 'PATH' in os.environ)"})
        assert pool.in_flight == 12
        results = _drain(pool, ["hang", *(f"echo{i}" for i in range(6)), "boom", "die", "secrets", "calc", "py"])
    finally:
        pool.close()
    hang, hang_at = results["hang"]
    assert hang.status == "timeout" and 3.0 <= hang_at < 8.0
    for i in range(6):
        echo, at = results[f"echo{i}"]
        assert echo.status == "ok" and echo.text == f"hi {i}"
        assert at < hang_at - 1.0, "a good call waited for the hanging one"
    assert results["boom"][0].status == "error" and "tool exploded" in results["boom"][0].text
    assert results["die"][0].status == "error" and "exited with code 3" in results["die"][0].text
    assert results["secrets"][0].text == "none"
    assert results["calc"][0].text == "303688"
    assert results["py"][0].text == "1024 False True\n"
    assert pool.in_flight == 0


def test_tool_pool_serves_its_workers_between_the_callers_polls():
    """The rollout polls once per engine step; the pool's own thread keeps the workers busy
    in between. Before, the caller's poll did the serving, so each worker finished at most one
    call per two polls (0.94 s mean latency for a calculator call on an H100,
    benchmarks/tool_pool.py)."""
    calc = resolve_tools(["calculator"])["calculator"]
    pool = ToolPool(num_workers=2, timeout_s=5.0)
    try:
        pool.start()
        began = time.monotonic()
        assert pool.poll(10.0) == [] and time.monotonic() - began < 1.0  # nothing in flight: no waiting
        for i in range(40):
            pool.submit(i, calc, {"expression": f"{i}*3"})
        time.sleep(3.0)  # no poll: the workers are served meanwhile (40 calls take ~0.1 s)
        results = dict(pool.poll(0.0))  # one poll takes them all
    finally:
        pool.close()
    assert {k: r.text for k, r in results.items()} == {i: str(i * 3) for i in range(40)}
    assert pool.in_flight == 0


def test_tool_pool_inline(plugin):
    tools = resolve_tools([f"boom={plugin}:boom", "calculator"])
    pool = ToolPool(num_workers=0, timeout_s=1.0)
    pool.submit(1, tools["boom"], {})
    pool.submit(2, tools["calculator"], {"expression": "2*21"})
    results = dict(pool.poll())
    assert results[1].status == "error" and results[2].text == "42"


def test_python_tool_is_isolated():
    out = TOOLS["python"]({"code": "import os, sys; print(os.getcwd() != %r, sys.flags.isolated)" % os.getcwd()})
    assert out == "True 1\n"
    assert "ZeroDivisionError" in TOOLS["python"]({"code": "1/0"})
