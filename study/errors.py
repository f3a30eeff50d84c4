"""Errors shared by the whole project.

A :class:`UserError` is a problem with the user's input (a bad file, flag, name or config key), not a bug.
Command-line entry points catch it and print ``error: <message>`` as one line on stderr with exit code 2
and no traceback, so the message must say on its own what is wrong and where (file, line, key).
"""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input, reported as one clear line (CLI exit code 2, no traceback)."""
