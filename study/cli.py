"""The one ``main()`` pattern of the commands that start Ray (``study.sweep``, ``study.replicate``, ``study.scaling``).

1. One line at once saying what is being prepared (before torch, the dataset and Ray, which take seconds on a
   busy machine); a dry run prints its plan alone, so it gets none. Every note of a normal run goes to stdout:
   stderr carries only errors and the Ctrl-C hint, so an empty stderr means a clean run.
2. Ray's authentication mode for the address (:func:`study.cluster.choose_auth_mode`).
3. The command's body. Bad input (:class:`~study.errors.UserError`, a model's ``ConfigError``) becomes one
   ``error:`` line per problem and exit code 2; Ctrl-C becomes one line saying how to continue and exit code 130.
   Neither prints a traceback.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable
from typing import Any

from study.cluster import choose_auth_mode
from study.errors import UserError, print_error

EXIT_INTERRUPTED = 130
CONSOLE_WIDTH = 120  # study.search.console.WIDTH, not imported: that module is not needed before the first line


def run_command(body: Callable[[], int], *, address: str, first_line: str | None,
                interrupted: str | None) -> int:
    """Run a Ray command's ``body`` under the pattern above; returns the exit code.

    ``first_line`` is printed on stdout before anything heavy is imported (None: print nothing, for dry runs);
    ``interrupted`` is what the user can do after Ctrl-C (e.g. the ``--resume`` command); None prints nothing,
    for a command run by another command that says how to continue.
    """
    if first_line is not None:
        # wrapped like every console line (a long study path would overflow 120 columns)
        print(textwrap.fill(first_line, width=CONSOLE_WIDTH, subsequent_indent="  ", break_on_hyphens=False),
              flush=True)
    choose_auth_mode(address)
    from models import ConfigError  # imports torch: only after the first line is out

    try:
        return body()
    except (UserError, ConfigError) as error:  # StudyConfigError too: one line per problem
        return print_error(error)
    except KeyboardInterrupt:
        if interrupted is not None:
            print(f"interrupted; {interrupted}", file=sys.stderr)
        return EXIT_INTERRUPTED


def print_dry_run(study: Any, verdict: str) -> int:
    """A dry run's output: the resolved study file on stdout, then ``# valid: <verdict>; results would go to …``
    on stderr (a dry run's stderr is its verdict alone); returns exit code 0."""
    mirrored = f", mirrored to {study.storage_uri}" if study.storage_uri else ""
    print(study.to_yaml(), end="")
    print(f"# valid: {verdict}; results would go to {study.storage}{mirrored}", file=sys.stderr)
    return 0
