"""Errors that the command line reports without a traceback."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class RunFailed(RuntimeError):
    """A run's processes failed after start-up; the message names the rank, the phase and
    the error (a user's bad input is a ValueError instead, refused before start-up)."""


class ConfigErrors(ValueError):
    """Every mistake found in a run's input at once, one message each (each names its key and
    the fix). One error reads as that error alone."""

    def __init__(self, messages: list[str]):
        self.messages = list(dict.fromkeys(messages))  # in order, each once
        super().__init__(self.render())

    def render(self) -> str:
        if len(self.messages) == 1:
            return self.messages[0]
        lines = "\n".join(f"  {i}. {m}" for i, m in enumerate(self.messages, 1))
        return f"{len(self.messages)} errors in the configuration:\n{lines}"


class ErrorCollector:
    """Runs independent checks and keeps every error they raise (`ConfigErrors` at the end)."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def run(self, check: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        """``check(*args, **kwargs)``; its ValueError is kept and None returned instead."""
        try:
            return check(*args, **kwargs)
        except ConfigErrors as err:
            self.messages += err.messages
        except ValueError as err:
            self.messages.append(str(err))
        return None

    def raise_if_any(self) -> None:
        if self.messages:
            raise ConfigErrors(self.messages)


class StopNow(KeyboardInterrupt):
    """A second Ctrl-C (or SIGTERM) while a run stops: end it at once, without the step's
    checkpoint. A KeyboardInterrupt: no ``except Exception`` on the way holds it up, and
    Ray's blocking calls, which run signal handlers, pass only a KeyboardInterrupt on (as a
    plain one: the driver re-raises it as StopNow). ``finally`` blocks still end the run's
    processes. The command line reports it in one line (exit 130)."""
