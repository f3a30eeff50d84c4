"""Errors shared by the whole project.

A :class:`UserError` is a problem with the user's input (a bad file, flag, name or config key), not a bug.
Command-line entry points catch it and print ``error: <message>`` as one line on stderr with exit code 2
and no traceback, so the message must say on its own what is wrong and where (file, line, key).
"""

from __future__ import annotations

import sys

EXIT_USER_ERROR = 2


class UserError(Exception):
    """A problem with the user's input, reported as one clear line (CLI exit code 2, no traceback)."""

    def lines(self) -> list[str]:
        """The ``error:`` lines to print; a subclass that collects several problems gives one line each."""
        return [str(self)]


def print_error(error: Exception) -> int:
    """Print a user error (or a model's ConfigError) as ``error: …`` lines on stderr; returns the exit code."""
    for line in error.lines() if isinstance(error, UserError) else [str(error)]:
        print(f"error: {line}", file=sys.stderr)
    return EXIT_USER_ERROR
