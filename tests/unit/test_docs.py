"""The docs' examples run, and the names they cite exist.

- docs/extending.md: every Python block marked ``<!-- example: NAME -->`` is extracted;
  blocks named ``*.py`` are written as modules (the plugins), the others are executed
  (they use the plugins the way the trainer does and assert the outcome). The model
  architecture block runs in tests/dist/test_docs_extending.py (it needs an engine).
- docs/troubleshooting.md and docs/multinode.md: every metric they name is one the
  trainer or workers write, and every config key they name is in the schema.
"""

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl_mp.config.schema import RootConfig

pytestmark = pytest.mark.unit
DOCS = Path(__file__).resolve().parents[2] / "docs"
SOURCE = Path(__file__).resolve().parents[2] / "verl_mp"
EXAMPLE = re.compile(r"<!-- example: (\S+) -->\n```python\n(.*?)```", re.S)
METRIC = re.compile(r"`((?:actor|critic|rollout|timing|perf|reward|response_length)/[a-z_/*]+)`")
CONFIG_KEY = re.compile(r"`((?:model|data|actor|ref|critic|rollout|algorithm|reward|reward_model|trainer)"
                        r"\.[a-z_.]+)(?:=[^`]*)?`")


def examples(page: str) -> dict[str, str]:
    return dict(EXAMPLE.findall((DOCS / page).read_text()))


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """The page's plugin modules, importable as the docs name them."""
    for name, code in examples("extending.md").items():
        if name.endswith(".py"):
            (tmp_path / name).write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("name", ["use_reward", "use_policy_loss", "use_advantages"])
def test_extending_example_runs(plugins, name):
    exec(compile(examples("extending.md")[name], f"docs/extending.md:{name}", "exec"), {})


def test_extending_has_the_four_extension_points():
    names = set(examples("extending.md"))
    assert {"my_rewards.py", "my_losses.py", "my_advantages.py", "register_seed_oss"} <= names


def _source_text() -> str:
    return "\n".join(p.read_text() for p in SOURCE.rglob("*.py"))


@pytest.mark.parametrize("page", ["troubleshooting.md", "multinode.md"])
def test_cited_metrics_and_keys_exist(page):
    text, source = (DOCS / page).read_text(), _source_text()
    for metric in set(METRIC.findall(text)):
        if "*" in metric:  # a family, e.g. timing/*_s
            prefix = metric.split("*")[0]
            assert prefix in source, metric
            continue
        name = metric.rsplit("/", 1)[-1]
        phase = re.fullmatch(r"timing/(\w+)_s", metric)  # StepTimer: timer.phase("x") -> timing/x_s
        assert f'"{metric}"' in source or f'"{name}"' in source or \
            (phase is not None and f'phase("{phase.group(1)}")' in source), metric
    schema = OmegaConf.structured(RootConfig)
    for key in set(CONFIG_KEY.findall(text)):
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(schema, parent)
        assert node is not None and leaf in node, key
