"""Errors that the command line reports in one line (no traceback)."""


class RunFailed(RuntimeError):
    """A run's processes failed after start-up; the message names the rank, the phase and
    the error (a user's bad input is a ValueError instead, refused before start-up)."""
