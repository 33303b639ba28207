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

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
PROGRESS_LOGGERS = ("verl_mp.trainer.console", "verl_mp.trainer.run")
"""INFO lines of these loggers reach the console also when quiet."""


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
