"""What the console shows while a run works: heartbeat lines after silences (with the loop's
step and phase), the SPMD
loop's warnings once (rank 0's), the log's last line as the heartbeat's detail, the ranks'
log followed under Ray, the short last line and an interrupted run's summary.md. The e2e
runs (tests/e2e/test_train_cli.py, test_reliability.py) check the same on the real CLI."""

import logging
import time

import pytest

from verl_mp.trainer import status
from verl_mp.trainer.report import console_summary, write_report
from verl_mp.utils.logs import FollowFile, Heartbeat, NotRankZeroWarnings, last_line, note_console

pytestmark = pytest.mark.unit


def test_heartbeat_speaks_after_a_silence_only(tmp_path, caplog):
    log = tmp_path / "ranks.log"
    log.write_text("2026-12-05 14:35:42,123 INFO vllm: loading weights\nbar  10%|#\rbar  60%|######\n")
    with caplog.at_level(logging.INFO, logger="verl_mp.trainer.run"):
        with Heartbeat("starting the ranks", [str(log)], every_s=1.5):
            time.sleep(3.6)
    beats = [r.getMessage() for r in caplog.records if r.name == "verl_mp.trainer.run"]
    assert 1 <= len(beats) <= 3, beats
    assert beats[0].startswith("starting the ranks (") and beats[0].endswith("; last log line: bar  60%|######")
    caplog.clear()
    run = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="verl_mp.trainer.run"):  # where the loop is: rank 0's record
        with Heartbeat("still working", every_s=1.0, where=lambda: status.where(str(run))):
            time.sleep(1.8)  # the heartbeat looks once a second
            rank0 = status.RankStatus(str(run), 0)
            time.sleep(2.2)
            rank0.phase("generate", 3)
            time.sleep(1.6)
    beats = [r.getMessage() for r in caplog.records if r.name == "verl_mp.trainer.run"]
    assert beats[0].startswith("still working (") and beats[0].endswith(")"), beats  # no record yet
    assert any(b.endswith("s), start-up") for b in beats), beats
    assert beats[-1].endswith("s), step 3, phase generate"), beats
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="verl_mp.trainer.run"):
        with Heartbeat("busy", every_s=1.5):
            for _ in range(8):  # the console got a line every 0.4 s: nothing to add
                note_console()
                time.sleep(0.4)
    assert not [r for r in caplog.records if r.name == "verl_mp.trainer.run"]


def test_last_line_strips_the_timestamp_and_takes_the_newest_file(tmp_path):
    old, new = tmp_path / "a.log", tmp_path / "b.log"
    old.write_text("2026-12-05 14:35:42,123 INFO x: old\n")
    new.write_text("2026-12-05 14:35:43,123 INFO verl_mp.engine: building the model\n\n")
    assert last_line([str(old), str(new), str(tmp_path / "missing")]) == "INFO verl_mp.engine: building the model"
    assert last_line([str(tmp_path / "missing")]) == ""


def test_not_rank_zero_demotes_only_the_loops_warnings():
    loop = logging.LogRecord("verl_mp.trainer.steps", logging.WARNING, "", 0, "step 2: no signal", None, None)
    engine = logging.LogRecord("verl_mp.engine.engine", logging.WARNING, "", 0, "rank trouble", None, None)
    assert NotRankZeroWarnings().filter(loop) and loop.levelname == "INFO"
    assert NotRankZeroWarnings().filter(engine) and engine.levelname == "WARNING"


def test_follow_file_shows_the_console_lines_written_by_other_processes(tmp_path, capsys):
    log = tmp_path / "ranks.log"
    log.write_text("before the run\n")
    follower = FollowFile(str(log), console_filter=lambda line: "WARNING verl_mp" in line, poll_s=0.05)
    with open(log, "a") as f:
        f.write("2026-12-05 14:35:42,123 INFO vllm: noise\n2026-12-05 14:35:42,124 WARNING verl_mp.x: shown\n")
        f.write("2026-12-05 14:35:42,125 WARNING verl_mp.x: half")
        f.flush()
    time.sleep(0.3)
    with open(log, "a") as f:
        f.write(" written\n")
    follower.stop()
    assert capsys.readouterr().err.splitlines() == ["2026-12-05 14:35:42,124 WARNING verl_mp.x: shown",
                                                    "2026-12-05 14:35:42,125 WARNING verl_mp.x: half written"]


def test_interrupted_summary_and_the_last_line(tmp_path):
    jsonl = tmp_path / "metrics.jsonl"
    jsonl.write_text('{"step": 0, "val/accuracy": 0.0}\n{"step": 1, "reward/score/mean": 0.5}\n'
                     '{"step": 2, "reward/score/mean": 0.6}\n{"step": 3, "reward/score/mean": 0.7}\n')
    summary = write_report(str(jsonl), str(tmp_path), wall_time_s=75.0, total_steps=8, stopped=True)
    text = (tmp_path / "summary.md").read_text()
    assert "- interrupted: stopped at step 3 of 8 (Ctrl-C or SIGTERM)" in text
    line = console_summary(summary, str(tmp_path))
    assert line == f"stopped at step 3 of 8 in 1m 15s; val accuracy 0.0% -> 0.0%; report: {tmp_path}/summary.md"
    done = write_report(str(jsonl), str(tmp_path), total_steps=3)
    assert "interrupted" not in (tmp_path / "summary.md").read_text()
    assert console_summary(done, "/r").startswith("done: step 3 of 3; val accuracy")
