"""Tracker backends, JSON safety, StepTimer and Progress."""

import io
import json
import logging
import math
import os
import sys
import time
import types

import numpy as np
import pytest
import torch

from verl_mp.trainer.tracking import (
    Progress,
    StepTimer,
    Tracker,
    format_console_line,
    read_jsonl,
    to_json_safe,
)

pytestmark = pytest.mark.unit


def test_jsonl_converts_values_and_stays_valid_json(tmp_path):
    with Tracker(["jsonl"], str(tmp_path), "p", "e") as tracker:
        tracker.log({"a": torch.tensor(1.5), "b": np.float32(2.0), "c": 3, "d": True}, step=1)
        tracker.log({"nan": float("nan"), "inf": torch.tensor(math.inf)}, step=2)
    path = tmp_path / "metrics.jsonl"
    for line in path.read_text().splitlines():
        json.loads(line, parse_constant=lambda name: pytest.fail(f"non-JSON token {name}"))
    assert read_jsonl(str(path)) == [
        {"step": 1, "a": 1.5, "b": 2.0, "c": 3.0, "d": 1.0},
        {"step": 2, "nan": None, "inf": None},
    ]


def test_jsonl_flushes_each_line_and_a_resumed_run_drops_what_its_checkpoint_lacks(tmp_path):
    tracker = Tracker(["jsonl"], str(tmp_path), "p", "e")
    for step in (0, 1, 2, 3):  # an interrupted run: its last checkpoint is step 2
        tracker.log({"x": float(step)}, step=step)
    assert len(read_jsonl(str(tmp_path / "metrics.jsonl"))) == 4  # visible before close
    tracker.close()
    tracker.close()  # idempotent
    with Tracker(["jsonl"], str(tmp_path), "p", "e", start_step=2) as tracker:  # resumed at 2
        tracker.log({"x": 30.0}, step=3)
    assert [(r["step"], r["x"]) for r in read_jsonl(str(tmp_path / "metrics.jsonl"))] == [
        (0, 0.0), (1, 1.0), (2, 2.0), (3, 30.0)]
    with Tracker(["jsonl"], str(tmp_path), "p", "e", start_step=0) as tracker:  # a fresh start
        tracker.log({"x": 5.0}, step=1)
    assert [r["step"] for r in read_jsonl(str(tmp_path / "metrics.jsonl"))] == [1]


def test_read_jsonl_skips_torn_last_line_only(tmp_path, caplog):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "x"')
    with caplog.at_level(logging.WARNING):
        assert read_jsonl(str(path)) == [{"step": 1}, {"step": 2}]
    assert "truncated" in caplog.text
    path.write_text('{"step": 1}\n{"step"\n{"step": 3}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_jsonl(str(path))


def test_value_conversion_errors_name_the_key():
    with pytest.raises(TypeError, match="'m'.*scalar"):
        to_json_safe(torch.ones(3), "m")
    with pytest.raises(TypeError, match="'s'.*number"):
        to_json_safe("text", "s")
    assert to_json_safe(None) is None


def test_console_line_fixed_order_short_precision_skips_absent():
    line = format_console_line(
        {"actor/approx_kl": 0.000123456, "reward/score/mean": 0.51234, "other": 9.0,
         "actor/pg_loss": float("nan")},
        step=7,
    )
    assert line == "step 7 | score 0.5123 | pg_loss nan | approx_kl 0.0001235"
    # a multi-turn run's line also says how many turns a conversation took and how many tool calls worked
    line = format_console_line({"response_length/mean": 96.0, "rollout/multi_turn/turns_per_conversation": 3.25,
                                "rollout/multi_turn/tool_call_success": 0.875, "timing/step_s": 1.5}, step=2)
    assert line == "step 2 | resp_len 96 | turns 3.25 | tool_ok 0.875 | step_s 1.5"


def test_console_writes_to_stream_or_logger(tmp_path, caplog):
    stream = io.StringIO()
    with Tracker(["console"], str(tmp_path), "p", "e", stream=stream) as tracker:
        tracker.log({"reward/score/mean": 0.5}, step=3)
    assert stream.getvalue() == "step 3 | score 0.5\n"
    with caplog.at_level(logging.INFO, logger="verl_mp.trainer.console"):
        with Tracker(["console"], str(tmp_path), "p", "e") as tracker:
            tracker.log({"val/accuracy": 0.25}, step=4)
    assert "step 4 | val_acc 0.25" in caplog.text


def test_unknown_backend_lists_valid_ones(tmp_path):
    with pytest.raises(ValueError, match=r"unknown backend.*'mlflow'.*'console'.*'wandb'"):
        Tracker(["jsonl", "mlflow"], str(tmp_path), "p", "e", rank=3)


def test_nonzero_rank_writes_nothing(tmp_path):
    log_dir = tmp_path / "logs"
    with Tracker(["jsonl", "tensorboard", "console"], str(log_dir), "p", "e", rank=1) as t:
        t.log({"x": 1.0}, step=1)
    assert not log_dir.exists()


def test_reserved_step_key(tmp_path):
    with Tracker(["jsonl"], str(tmp_path), "p", "e") as tracker:
        with pytest.raises(ValueError, match="'step' is reserved"):
            tracker.log({"step": 1.0}, step=1)


def test_tensorboard_writes_event_file(tmp_path):
    config = {"trainer": {"total_steps": 3}}
    with Tracker(["tensorboard"], str(tmp_path), "p", "e", config=config) as tracker:
        tracker.log({"actor/pg_loss": 0.5, "bad": float("nan")}, step=1)
    events = os.listdir(tmp_path / "tensorboard")
    assert any(name.startswith("events.out.tfevents") for name in events)


def test_tensorboard_missing_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ImportError, match="trainer.logger.*pip install tensorboard"):
        Tracker(["tensorboard"], str(tmp_path), "p", "e")


def test_wandb_missing_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match="trainer.logger.*pip install wandb"):
        Tracker(["wandb"], str(tmp_path), "p", "e")


def test_wandb_backend_with_fake_module(tmp_path, monkeypatch):
    calls = []
    run = types.SimpleNamespace(
        log=lambda metrics, step: calls.append(("log", metrics, step)),
        finish=lambda: calls.append(("finish",)),
    )

    def init(**kwargs):
        calls.append(("init", kwargs))
        return run

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    with Tracker(["wandb"], str(tmp_path), "proj", "exp", config={"a": 1}) as tracker:
        tracker.log({"x": np.float64(2.0)}, step=5)
    assert calls[0] == (
        "init", {"project": "proj", "name": "exp", "config": {"a": 1}, "dir": str(tmp_path)}
    )
    assert calls[1:] == [("log", {"x": 2.0}, 5), ("finish",)]


def test_step_timer_phases_accumulate_and_reset():
    timer = StepTimer()
    with timer.phase("generate"):
        time.sleep(0.02)
    with timer.phase("generate"):
        time.sleep(0.01)
    with timer.phase("train"):
        pass
    metrics = timer.metrics()
    assert set(metrics) == {"timing/generate_s", "timing/train_s", "timing/step_s"}
    assert metrics["timing/generate_s"] >= 0.03
    assert metrics["timing/step_s"] >= metrics["timing/generate_s"] + metrics["timing/train_s"]
    assert set(timer.metrics()) == {"timing/step_s"}  # next step starts empty
    with pytest.raises(ValueError, match="reserved"):
        with timer.phase("step"):
            pass


def test_step_timer_records_phase_that_raises():
    timer = StepTimer()
    with pytest.raises(RuntimeError):
        with timer.phase("reward"):
            raise RuntimeError("boom")
    assert "timing/reward_s" in timer.metrics()


def test_progress_rank0_shows_postfix_others_silent():
    out = io.StringIO()
    with Progress(total=4, initial=1, rank=0, file=out) as bar:
        bar.update({"reward/score/mean": 0.5, "val/accuracy": 0.25, "timing/step_s": 1.5})
        bar.update({"reward/score/mean": 0.75})
    text = out.getvalue()
    assert "3/4" in text and "score=0.75" in text and "val=0.25" in text
    silent = io.StringIO()
    with Progress(total=4, rank=1, file=silent) as bar:
        bar.update({"reward/score/mean": 0.5})
    assert silent.getvalue() == ""
