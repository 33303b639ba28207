"""Metric tracking for the trainer driver: logging backends, a phase timer, a progress bar.

``Tracker`` fans one ``log(metrics, step)`` call out to the backends named in
``trainer.logger``:

- ``console``: one compact line per step with a fixed selection of key metrics
  (``CONSOLE_KEYS``), written through the ``verl_mp.trainer.console`` logger at INFO
  (configure logging at INFO in the driver) or to a stream passed as ``stream=``.
- ``jsonl``: appends ``{"step": step, **metrics}`` to ``<log_dir>/metrics.jsonl``, one
  flushed line per call. Values are converted to plain floats (tensors and numpy
  scalars via ``.item()``); NaN and +-inf are written as ``null`` so every line is valid
  JSON (Python's default would write the non-standard tokens ``NaN``/``Infinity``).
- ``tensorboard``: ``torch.utils.tensorboard.SummaryWriter`` under
  ``<log_dir>/tensorboard``; the run config, when given, is logged once as text.
- ``wandb``: ``wandb.init(project, name=experiment, config)``; needs the wandb package.

Only rank 0 writes anything; on other ranks every method is a no-op (backend names are
still validated, so a typo fails on every rank alike).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

logger = logging.getLogger(__name__)
console_logger = logging.getLogger("verl_mp.trainer.console")

VALID_BACKENDS = ("console", "jsonl", "tensorboard", "wandb")
METRICS_FILENAME = "metrics.jsonl"

# (metric key, short console label), in console order.
CONSOLE_KEYS = (
    ("reward/score/mean", "score"),
    ("val/accuracy", "val_acc"),
    ("actor/pg_loss", "pg_loss"),
    ("actor/approx_kl", "approx_kl"),
    ("actor/kl_loss", "kl_loss"),
    ("actor/clipfrac", "clipfrac"),
    ("actor/entropy", "entropy"),
    ("actor/grad_norm", "gnorm"),
    ("critic/vf_loss", "vf_loss"),
    ("rollout/logprob_diff_max", "lp_diff_max"),
    ("response_length/mean", "resp_len"),
    ("rollout/multi_turn/turns_per_conversation", "turns"),  # multi-turn runs only
    ("rollout/multi_turn/tool_call_success", "tool_ok"),
    ("timing/step_s", "step_s"),
    ("perf/tokens_per_s", "tok/s"),
)


def to_json_safe(value: Any, key: str = "?") -> float | None:
    """One metric value as a float, or None when it is NaN/inf (JSON has no such numbers).

    Accepts Python numbers, bools, numpy scalars and one-element tensors/arrays.
    """
    if value is None:
        return None
    if hasattr(value, "item"):
        try:
            value = value.item()
        except (ValueError, RuntimeError) as exc:
            raise TypeError(f"metric {key!r} must be a scalar, got {value!r}") from exc
    if not isinstance(value, (int, float)):
        raise TypeError(f"metric {key!r} must be a number, got {type(value).__name__}")
    value = float(value)
    return value if math.isfinite(value) else None


def read_jsonl(path: str) -> list[dict]:
    """All records of a metrics.jsonl file, in file order.

    A torn last line (the process died mid-write) is skipped with a warning; a
    malformed line anywhere else raises ``ValueError``.
    """
    with open(path, encoding="utf-8") as f:
        lines = [line for line in f.read().split("\n") if line.strip()]
    records = []
    for index, line in enumerate(lines):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if index == len(lines) - 1:
                logger.warning("%s: skipping a truncated last line (%s)", path, exc)
                break
            raise ValueError(f"{path}: line {index + 1} is not valid JSON: {exc}") from exc
    return records


def format_console_line(metrics: dict[str, Any], step: int) -> str:
    """``step 3 | score 0.512 | kl 0.00031 | ...`` over the CONSOLE_KEYS that are present."""
    parts = [f"step {step}"]
    for key, label in CONSOLE_KEYS:
        if key in metrics:
            value = to_json_safe(metrics[key], key)
            parts.append(f"{label} {'nan' if value is None else format(value, '.4g')}")
    return " | ".join(parts)


class _ConsoleBackend:
    """Writes one compact line per step to a stream, or to the console logger."""

    def __init__(self, stream: TextIO | None):
        self._stream = stream

    def log(self, metrics: dict[str, float | None], step: int) -> None:
        line = format_console_line(metrics, step)
        if self._stream is None:
            console_logger.info(line)
        else:
            self._stream.write(line + "\n")
            self._stream.flush()

    def close(self) -> None:
        pass


class _JsonlBackend:
    """One JSON object per step in ``<log_dir>/metrics.jsonl``. A run that starts at step
    ``start_step`` (resumed from that checkpoint, or 0) first drops the rows of later steps
    (an interrupted run's steps that its checkpoint does not hold; they are run again), so
    the file is always one consistent history."""

    def __init__(self, log_dir: str, start_step: int = 0):
        self.path = os.path.join(log_dir, METRICS_FILENAME)
        if os.path.exists(self.path):
            _keep_rows(self.path, lambda row: start_step > 0 and row.get("step", 0) <= start_step)
        self._file = open(self.path, "a", encoding="utf-8")

    def log(self, metrics: dict[str, float | None], step: int) -> None:
        self._file.write(json.dumps({"step": step, **metrics}, allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _keep_rows(path: str, keep) -> None:
    """Rewrite a JSONL file atomically with the rows ``keep(row)`` accepts."""
    rows = [line for line in open(path, encoding="utf-8") if line.strip() and keep(json.loads(line))]
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(rows)
    os.replace(tmp, path)


class _TensorboardBackend:
    """Scalars to a SummaryWriter under ``<log_dir>/tensorboard``; the config as text.
    A resumed run purges the events after its checkpoint's step (TensorBoard's
    ``purge_step``), like the JSONL rows."""

    def __init__(self, log_dir: str, config: Any, start_step: int = 0):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ImportError(
                "trainer.logger includes 'tensorboard' but it cannot be imported "
                f"({exc}); `pip install tensorboard` or remove it from trainer.logger"
            ) from exc
        self._writer = SummaryWriter(log_dir=os.path.join(log_dir, "tensorboard"), purge_step=start_step + 1)
        if config is not None:
            self._writer.add_text("config", _config_as_markdown(config), global_step=0)

    def log(self, metrics: dict[str, float | None], step: int) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, math.nan if value is None else value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class _WandbBackend:
    """One wandb run named after the experiment."""

    def __init__(self, log_dir: str, project: str, experiment: str, config: Any):
        try:
            import wandb
        except ImportError as exc:
            raise ImportError(
                "trainer.logger includes 'wandb' but the wandb package is not installed; "
                "`pip install wandb` or remove 'wandb' from trainer.logger"
            ) from exc
        self._run = wandb.init(
            project=project, name=experiment, config=_config_as_dict(config), dir=log_dir
        )

    def log(self, metrics: dict[str, float | None], step: int) -> None:
        self._run.log({k: math.nan if v is None else v for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        self._run.finish()


def _config_as_dict(config: Any) -> dict | None:
    """A plain dict of a DictConfig / structured config / dict / YAML text (None stays None).

    Not resolved: ``${oc.env:...}`` references (what `verl_mp.config.loader.to_yaml` writes
    for values from the environment) must reach TensorBoard/W&B as references, not secrets.
    """
    if config is None:
        return None
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.create(config), resolve=False)


def _config_as_markdown(config: Any) -> str:
    """The config as YAML, indented so TensorBoard's markdown shows it as a code block."""
    from omegaconf import OmegaConf

    yaml_text = OmegaConf.to_yaml(_config_as_dict(config))
    return "\n".join("    " + line for line in yaml_text.splitlines())


class Tracker:
    """Sends per-step metrics to the configured backends (rank 0 only)."""

    def __init__(
        self,
        backends: list[str],
        log_dir: str,
        project: str,
        experiment: str,
        config: Any = None,
        rank: int = 0,
        stream: TextIO | None = None,
        start_step: int = 0,
    ):
        """``stream``: where the console backend writes (default: the console logger).
        ``start_step``: the step this run continues from (its checkpoint's; 0 when fresh):
        what the files hold after it is dropped."""
        unknown = [name for name in backends if name not in VALID_BACKENDS]
        if unknown:
            raise ValueError(
                f"trainer.logger has unknown backend(s) {unknown}; "
                f"valid ones: {list(VALID_BACKENDS)}"
            )
        self.rank = rank
        self._backends: list[Any] = []
        if rank != 0:
            return
        os.makedirs(log_dir, exist_ok=True)
        try:
            for name in dict.fromkeys(backends):  # de-duplicated, order kept
                self._backends.append(
                    self._make_backend(name, log_dir, project, experiment, config, stream, start_step)
                )
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _make_backend(name, log_dir, project, experiment, config, stream, start_step) -> Any:
        if name == "console":
            return _ConsoleBackend(stream)
        if name == "jsonl":
            return _JsonlBackend(log_dir, start_step)
        if name == "tensorboard":
            return _TensorboardBackend(log_dir, config, start_step)
        return _WandbBackend(log_dir, project, experiment, config)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Record ``metrics`` for ``step`` on every backend (no-op off rank 0)."""
        if not self._backends:
            return
        if "step" in metrics:
            raise ValueError("metric key 'step' is reserved; pass the step as the step argument")
        clean = {key: to_json_safe(value, key) for key, value in metrics.items()}
        for backend in self._backends:
            backend.log(clean, int(step))

    def close(self) -> None:
        """Flush and close every backend; safe to call twice."""
        backends, self._backends = self._backends, []
        for backend in backends:
            backend.close()

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class StepTimer:
    """Wall-clock time of named phases within one step.

    ``with timer.phase("generate"): ...``; a phase entered twice in a step adds up.
    ``metrics()`` returns ``{"timing/<phase>_s": ..., "timing/step_s": ...}`` where
    ``step_s`` is the wall time since the step began (untimed gaps included), and starts
    the next step.
    """

    def __init__(self):
        self._phase_s: dict[str, float] = {}
        self._step_start = time.perf_counter()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the enclosed block as phase ``name``."""
        if name == "step":
            raise ValueError("phase name 'step' is reserved for the whole-step time")
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed_s = time.perf_counter() - start
            self._phase_s[name] = self._phase_s.get(name, 0.0) + elapsed_s

    def reset(self) -> None:
        """Forget the phases so far and start a new step now."""
        self._phase_s = {}
        self._step_start = time.perf_counter()

    def metrics(self) -> dict[str, float]:
        """This step's timings in seconds; then starts the next step."""
        out = {f"timing/{name}_s": seconds for name, seconds in self._phase_s.items()}
        out["timing/step_s"] = time.perf_counter() - self._step_start
        self.reset()
        return out


# (metric key, postfix label) shown next to the progress bar.
PROGRESS_KEYS = (("reward/score/mean", "score"), ("val/accuracy", "val"), ("timing/step_s", "s/it"))


class Progress:
    """A tqdm bar over training steps, shown on rank 0 only."""

    def __init__(self, total: int, initial: int = 0, rank: int = 0, file: TextIO | None = None):
        import sys

        from tqdm import tqdm

        quiet = file is None and not sys.stderr.isatty()  # in a log file it only repeats the step lines
        self._bar = tqdm(
            total=total, initial=initial, disable=rank != 0 or quiet, desc="train", unit="step",
            dynamic_ncols=True, file=file,
        )
        self._postfix: dict[str, str] = {}

    def update(self, metrics: dict[str, Any] | None = None) -> None:
        """Advance one step; show the latest score / val accuracy / step time as postfix."""
        for key, label in PROGRESS_KEYS:
            if metrics and key in metrics:
                value = to_json_safe(metrics[key], key)
                self._postfix[label] = "nan" if value is None else f"{value:.3g}"
        if self._postfix:
            self._bar.set_postfix(self._postfix, refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        """Close the bar (idempotent)."""
        self._bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
