"""Where each torchrun rank is, so that a failed run is reported with its rank and phase,
and the console's heartbeat says where the run is (`where`; under Ray the driver, which
runs the loop, writes rank 0's record).

Every rank writes ``<run dir>/.status/rank<r>.json`` when a phase starts (phase, step,
pid) and, when it fails with a Python exception, ``rank<r>.error.json`` (the exception's
type and message). After torchrun fails, `failure_report` names the rank that failed
first (torchrun's own "Root Cause" record, parsed from its output), its phase and step,
and its error: a Python exception, or the signal that killed it (SIGKILL: often the
out-of-memory killer). Ranks stopped by the launcher after another rank failed are not
the cause and are not blamed.
"""

from __future__ import annotations

import json
import os
import re
import time

STATUS_DIR = ".status"


class RankStatus:
    def __init__(self, run_dir: str, rank: int):
        self.dir = os.path.join(run_dir, STATUS_DIR)
        os.makedirs(self.dir, exist_ok=True)
        self.rank = rank
        self.phase_name, self.step = "start-up", 0
        self._write("", {})

    def phase(self, phase: str, step: int) -> None:
        self.phase_name, self.step = phase, step
        self._write("", {})

    def failed(self, err: BaseException) -> None:
        self._write(".error", {"type": type(err).__name__, "message": str(err).strip()})

    def _write(self, suffix: str, extra: dict) -> None:
        path = os.path.join(self.dir, f"rank{self.rank}{suffix}.json")
        record = {"rank": self.rank, "pid": os.getpid(), "phase": self.phase_name, "step": self.step,
                  "time": time.time(), **extra}
        with open(f"{path}.tmp", "w") as f:
            json.dump(record, f)
        os.replace(f"{path}.tmp", path)


def where(run_dir: str) -> str:
    """Where rank 0 (the loop's driver under Ray) is, for the console's heartbeat: ``step 3,
    phase generate``, ``start-up``, or "" before any rank has written its record."""
    try:
        with open(os.path.join(run_dir, STATUS_DIR, "rank0.json")) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return ""
    if record.get("phase") == "start-up":
        return "start-up"
    return f"step {record.get('step', '?')}, phase {record.get('phase', '?')}"


def clear(run_dir: str) -> None:
    """Forget an earlier run's records (the driver calls this before starting ranks)."""
    directory = os.path.join(run_dir, STATUS_DIR)
    if os.path.isdir(directory):
        for name in os.listdir(directory):
            os.remove(os.path.join(directory, name))


_ROOT_RANK = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)


def failure_report(run_dir: str, launcher_output: str = "") -> str:
    """One paragraph: which rank failed first, in which phase and step, and why."""
    records = _read(run_dir)
    errors = {r["rank"]: r for r in records.get(".error", [])}
    match = _ROOT_RANK.search(launcher_output)
    rank = int(match.group(1)) if match else (min(errors, key=lambda r: errors[r]["time"]) if errors else None)
    if rank is None:
        return "the ranks failed before any of them reported (see the log above)"
    where = {r["rank"]: r for r in records.get("", [])}.get(rank, {})
    place = f"in phase {where.get('phase', '?')} of step {where.get('step', '?')}" if where else "at start-up"
    if rank in errors:
        err = errors[rank]
        return f"rank {rank} failed {place}: {err['type']}: {err['message']}"
    code = int(match.group(2)) if match else 0
    why = _signal_text(-code) if code < 0 else f"exit code {code}"
    return f"rank {rank} died {place} without a Python error ({why})"


def _signal_text(signum: int) -> str:
    import signal

    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    hint = ": killed from outside, often by the out-of-memory killer" if name == "SIGKILL" else ""
    return f"{name}{hint}"


def _read(run_dir: str) -> dict[str, list[dict]]:
    directory = os.path.join(run_dir, STATUS_DIR)
    out: dict[str, list[dict]] = {}
    if not os.path.isdir(directory):
        return out
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".json"):
            continue
        kind = ".error" if name.endswith(".error.json") else ""
        try:
            with open(os.path.join(directory, name)) as f:
                out.setdefault(kind, []).append(json.load(f))
        except (OSError, ValueError):
            continue
    return out
