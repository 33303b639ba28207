"""Logging for the command line: quiet on the console, everything in the run's log file.

Quiet (the default): the console shows this project's own progress lines (one line per
step, start and end of the run) and warnings, and every error; everything else (INFO of
the libraries, Python warnings such as megatron's "Apex is not installed") goes to the log
file only. ``verbose``: the console shows everything too.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
PROGRESS_LOGGERS = ("verl_mp.trainer.console", "verl_mp.trainer.run")
"""INFO lines of these loggers reach the console also when quiet."""


_last_console_s = time.monotonic()
"""When the console last got a line (`note_console`): `Heartbeat` speaks up after silences."""


def note_console() -> None:
    global _last_console_s
    _last_console_s = time.monotonic()


class _NoteConsole(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        note_console()
        return True


class _QuietFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        ours = record.name.startswith("verl_mp")
        if record.levelno >= logging.WARNING:
            return ours
        return record.name.startswith(PROGRESS_LOGGERS)


def setup_logging(verbose: bool = False) -> None:
    """Console handler on the root logger (INFO, filtered unless ``verbose``)."""
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for handler in list(root.handlers):  # ours from an earlier call; others' (pytest's) stay
        if getattr(handler, "_verl_mp", False):
            root.removeHandler(handler)
    console = logging.StreamHandler(sys.stderr)
    console._verl_mp = True
    console.setFormatter(logging.Formatter(FORMAT))
    if not verbose:
        console.addFilter(_QuietFilter())
    console.addFilter(_NoteConsole())  # last: only lines that pass the filters count
    root.addHandler(console)
    logging.captureWarnings(True)  # Python warnings become log records (file only when quiet)


def log_to_file(path: str) -> None:
    """Everything (INFO and up, unfiltered) also goes to ``path``."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    handler = logging.FileHandler(path)
    handler._verl_mp = True
    handler.setFormatter(logging.Formatter(FORMAT))
    logging.getLogger().addHandler(handler)


def is_console_line(line: str) -> bool:
    """For rank output streamed through the driver: what quiet mode shows of it."""
    return (any(f" {name}:" in line for name in PROGRESS_LOGGERS) or " WARNING verl_mp" in line
            or " ERROR " in line)


HEARTBEAT_S = 15.0
"""The longest the console stays silent while a command works (`Heartbeat`)."""


class Heartbeat:
    """A console line whenever the console has been silent for ``every_s`` seconds while work
    goes on (start-up, a warm start, a resume): what is being done (`doing`, set by the
    caller), for how long, where the run is (``where()``: the training loop's step and phase,
    `verl_mp.trainer.status.where`; "" for none) and the last line of the most recently
    written of ``logs`` (what the processes are busy with). A daemon thread, from ``with`` to
    its end."""

    def __init__(self, doing: str, logs: list[str] | None = None, every_s: float = HEARTBEAT_S,
                 where: Callable[[], str] | None = None):
        self.doing, self.logs, self.every_s = doing, list(logs or []), every_s
        self.where = where or (lambda: "")
        self._started = time.monotonic()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="console-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        note_console()
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._done.set()

    def _beat(self) -> None:
        while not self._done.wait(1.0):
            if time.monotonic() - _last_console_s >= self.every_s:
                busy, where = last_line(self.logs), self.where()
                logging.getLogger("verl_mp.trainer.run").info(
                    "%s (%d s)%s%s", self.doing, time.monotonic() - self._started, f", {where}" if where else "",
                    f"; last log line: {busy}" if busy else "")


def last_line(paths: list[str], max_chars: int = 160) -> str:
    """The last non-empty line (progress bars: their last state) of the most recently
    modified of ``paths`` that exists, without its timestamp; "" if none."""
    found = [(os.path.getmtime(p), p) for p in paths if os.path.exists(p)]
    if not found:
        return ""
    with open(max(found)[1], "rb") as f:
        f.seek(max(0, os.path.getsize(f.name) - 8192))
        tail = f.read().decode(errors="replace")
    lines = [[part.strip() for part in line.split("\r") if part.strip()] for line in tail.split("\n")]
    lines = [parts[-1] for parts in lines if parts]  # a progress bar's last state
    if not lines:
        return ""
    text = lines[-1]
    if len(text) > 24 and text[4] == "-" and text[10] == " ":  # "2026-12-05 14:35:42,123 INFO x: ..."
        text = text.split(" ", 2)[-1]
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


class FollowFile:
    """Copies the lines appended to ``path`` (written by other processes) to our stderr, those
    that ``console_filter`` passes (all if None), on a daemon thread until `stop`: the Ray
    ranks' log file shown like the torchrun ranks' stream."""

    def __init__(self, path: str, console_filter=None, poll_s: float = 0.2):
        self.path, self.console_filter, self.poll_s = path, console_filter, poll_s
        self._done = threading.Event()
        self._offset = os.path.getsize(path) if os.path.exists(path) else 0
        self._thread = threading.Thread(target=self._follow, name="follow-ranks-log", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        pending = ""
        while True:
            done = self._done.is_set()  # read before the last pass: nothing written before stop is lost
            if os.path.exists(self.path):
                with open(self.path, "rb") as f:
                    f.seek(self._offset)
                    data = f.read()
                self._offset += len(data)
                pending += data.decode(errors="replace")
                *lines, pending = pending.split("\n")
                for line in lines:
                    if self.console_filter is None or self.console_filter(line + "\n"):
                        sys.stderr.write(line + "\n")
                        note_console()
            if done:
                return
            self._done.wait(self.poll_s)

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=5)


class NotRankZeroWarnings(logging.Filter):
    """On SPMD ranks other than 0: the warnings of the driver loop's loggers (``verl_mp.trainer``),
    which every rank computes alike, go to the log as INFO, so that the console shows each
    once (rank 0's), not once per rank. The workers' and engines' warnings (a rank's own
    trouble) stay warnings."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and record.name.startswith("verl_mp.trainer"):
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True
