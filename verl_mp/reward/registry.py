"""The reward-function registry and ``module:function`` plugin loading.

Signature of every reward function::

    fn(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None)
        -> float | dict   # a dict must have a "score" key; other numeric keys become
                          # metrics ("acc" becomes reward/accuracy)

In multi-turn rollouts ``solution_str`` is the last assistant turn, and a function with a
``trajectory`` parameter (or ``**kwargs``) also gets the whole conversation
(`verl_mp.rollout.types.RolloutOutput.trajectories`: its turns, tool calls and tool
responses) as ``trajectory=``.

Names are resolved by ``get_reward_fn``: a registered name (``gsm8k``, ``math_boxed``,
``arith_exact``, ``format``), a plugin ``package.module:function`` or a plugin
``/path/to/file.py:function``.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verl_mp.reward import rules
from verl_mp.utils.errors import ConfigErrors, ErrorCollector

if TYPE_CHECKING:
    from verl_mp.config.schema import RewardConfig, RewardModelConfig

RewardFn = Callable[[str, str, str, "dict[str, Any] | None"], "float | dict[str, Any]"]

REWARD_FUNCTIONS: dict[str, RewardFn] = {
    "gsm8k": rules.gsm8k_reward,
    "math_boxed": rules.boxed_math_reward,
    "arith_exact": rules.arith_exact_reward,
    "arith_tool": rules.arith_tool_reward,
    "format": rules.format_reward,
}
"""Built-in rules (`verl_mp.reward.rules`) and those added with `register_reward`."""

# data_source -> reward function name, used when the config maps nothing else.
DEFAULT_FN_BY_SOURCE: dict[str, str] = {
    "openai/gsm8k": "gsm8k",
    "gsm8k": "gsm8k",
    "lighteval/MATH": "math_boxed",
    "DigitalLearningGmbH/MATH-lighteval": "math_boxed",
    "HuggingFaceH4/MATH-500": "math_boxed",
    "synthetic_arith": "arith_exact",
    "synthetic_tool_arith": "arith_tool",
}


def no_reward_fn_message(data_source: str, mapped: Iterable[str], where: str = "") -> str:
    """The error for a data source that no reward function serves, with the fix as it is typed
    on the command line."""
    names = sorted(REWARD_FUNCTIONS)
    if re.fullmatch(r"[\w/-]+", data_source):
        fix = f"reward.fn_by_source.{data_source}=NAME"
    else:  # dots, spaces...: the dotlist cannot name the key, a dict value can
        fix = f"'reward.fn_by_source={{\"{data_source}\": NAME}}'"
    return (f"no reward function for data_source '{data_source}'{where}: map it with {fix} (NAME: one of "
            f"{names} or module:function), or serve every unmapped source with reward.default_fn=NAME "
            f"(mapped sources: {sorted(mapped)})")


def unserved_sources(data_sources: Iterable[str], fn_by_source: dict[str, str], default_fn: str | None) -> list[str]:
    """The data sources that neither ``fn_by_source`` (over `DEFAULT_FN_BY_SOURCE`) nor
    ``default_fn`` serves."""
    if default_fn:
        return []
    mapped = {**DEFAULT_FN_BY_SOURCE, **fn_by_source}
    return sorted(set(data_sources) - set(mapped))


def check_reward_fns(reward: RewardConfig) -> None:
    """Every rule reward function of ``reward`` (the ``reward`` section) resolves, a name or a
    plugin: `ConfigErrors` with one message per one that does not, naming its key."""
    named = [("reward.default_fn", reward.default_fn)] if reward.default_fn else []
    named += [(f"reward.fn_by_source.{src}", fn) for src, fn in reward.fn_by_source.items()]
    errors = ErrorCollector()
    for key, name in named:
        errors.run(_lookup, key, name)
    errors.raise_if_any()


def _lookup(key: str, name: str) -> RewardFn:
    try:
        return get_reward_fn(name)
    except ValueError as err:
        raise ValueError(f"{key}={name!r}: {err}") from None


def check_reward_sources(reward: RewardConfig, reward_model: RewardModelConfig, data_sources: set[str],
                         setting: str) -> None:
    """Every data source of the data (``setting``: the key naming the files) has a rule reward
    function, unless a reward model replaces them."""
    if reward_model.enable and reward_model.combine == "replace":
        return  # no rule function runs
    mapped = {**DEFAULT_FN_BY_SOURCE, **reward.fn_by_source}
    missing = unserved_sources(data_sources, reward.fn_by_source, reward.default_fn)
    if missing:
        raise ConfigErrors([no_reward_fn_message(src, mapped, where=f" (in {setting})") for src in missing])


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator adding a reward function under ``name``; a duplicate name raises."""

    def decorator(fn: RewardFn) -> RewardFn:
        if name in REWARD_FUNCTIONS:
            raise ValueError(
                f"reward function '{name}' is already registered "
                f"({REWARD_FUNCTIONS[name].__module__}); pick another name"
            )
        REWARD_FUNCTIONS[name] = fn
        return fn

    return decorator


def get_reward_fn(name: str) -> RewardFn:
    """A registered reward function by name, or a plugin given as ``module:function``."""
    if ":" in name:
        return load_plugin(name)
    if name not in REWARD_FUNCTIONS:
        close = difflib.get_close_matches(name, list(REWARD_FUNCTIONS), n=1)
        guess = f"did you mean '{close[0]}'? " if close else ""
        raise ValueError(
            f"unknown reward function '{name}'; {guess}valid names: {sorted(REWARD_FUNCTIONS)}, "
            "or a plugin 'package.module:function' / '/path/to/file.py:function'"
        )
    return REWARD_FUNCTIONS[name]


def load_plugin(spec: str) -> RewardFn:
    """Import ``package.module:function`` or ``/path/file.py:function``; clear errors."""
    module_part, _, attr = spec.rpartition(":")
    if not module_part or not attr:
        raise ValueError(f"reward plugin '{spec}' must look like 'package.module:function'")
    if module_part.endswith(".py"):
        fn: Any = FileFunction(module_part, attr)
        fn.resolve()
        return fn
    try:
        module = importlib.import_module(module_part)
    except ImportError as err:
        raise ValueError(
            f"cannot import module '{module_part}' for reward plugin '{spec}': {err}. Fix: "
            "install it or add its folder to PYTHONPATH, or give a path '/dir/file.py:fn'."
        ) from err
    return _get_callable(module, attr, spec)


def _get_callable(module: Any, attr: str, spec: str) -> RewardFn:
    fn = getattr(module, attr, None)
    if not callable(fn):
        names = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ValueError(f"reward plugin '{spec}': no function '{attr}'; callables there: {names}")
    return fn


# Plugin files already executed in this process, by absolute path (each runs once).
_FILE_MODULES: dict[str, Any] = {}


def _exec_file(path: str) -> Any:
    """Execute a plugin .py file as a fresh module."""
    if not Path(path).is_file():
        raise ValueError(f"reward plugin file {path} does not exist")
    name = f"_verl_mp_reward_plugin_{len(_FILE_MODULES)}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FileFunction:
    """A reward function in a ``.py`` file, loaded lazily.

    Pickles as (path, name), so reward worker processes load the file themselves.
    """

    def __init__(self, path: str, name: str):
        self.path, self.name = str(Path(path).expanduser().resolve()), name
        self._fn: RewardFn | None = None

    def __getstate__(self) -> dict[str, str]:
        return {"path": self.path, "name": self.name}

    def __setstate__(self, state: dict[str, str]) -> None:
        self.path, self.name, self._fn = state["path"], state["name"], None

    def resolve(self) -> RewardFn:
        """Load the file (once) and return the function."""
        if self._fn is None:
            module = _FILE_MODULES.get(self.path) or _exec_file(self.path)
            _FILE_MODULES[self.path] = module
            self._fn = _get_callable(module, self.name, f"{self.path}:{self.name}")
        return self._fn

    def __call__(self, *args: Any) -> float | dict[str, Any]:
        return self.resolve()(*args)
