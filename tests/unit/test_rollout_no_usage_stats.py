"""The vLLM rollout turns vLLM's usage statistics off before vLLM starts (before this change
nothing set ``VLLM_NO_USAGE_STATS``/``DO_NOT_TRACK`` and vLLM reports usage by default)."""

import os

import pytest

from verl_mp.config.rollout import RolloutConfig
from verl_mp.rollout import vllm_rollout

pytestmark = pytest.mark.unit


class _Stop(Exception):
    pass


def test_usage_stats_off_before_vllm_starts(monkeypatch):
    environ = {k: v for k, v in os.environ.items() if k not in ("VLLM_NO_USAGE_STATS", "DO_NOT_TRACK")}
    monkeypatch.setattr(os, "environ", environ)  # what the constructor sets stays in the test

    def first_vllm_step():  # the first thing that touches vLLM: stop there
        raise _Stop

    monkeypatch.setattr(vllm_rollout, "check_vllm", first_vllm_step)
    with pytest.raises(_Stop):
        vllm_rollout.VLLMRollout(cfg=RolloutConfig(), model_path="unused", num_kv_heads=1)
    assert environ["VLLM_NO_USAGE_STATS"] == "1" and environ["DO_NOT_TRACK"] == "1"
