"""Errors that the command line reports in one line (no traceback)."""


class RunFailed(RuntimeError):
    """A run's processes failed after start-up; the message names the rank, the phase and
    the error (a user's bad input is a ValueError instead, refused before start-up)."""


class StopNow(KeyboardInterrupt):
    """A second Ctrl-C (or SIGTERM) while a run stops: end it at once, without the step's
    checkpoint. A KeyboardInterrupt: no ``except Exception`` on the way holds it up, and
    Ray's blocking calls, which run signal handlers, pass only a KeyboardInterrupt on (as a
    plain one: the driver re-raises it as StopNow). ``finally`` blocks still end the run's
    processes. The command line reports it in one line (exit 130)."""
