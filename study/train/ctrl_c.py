"""Ctrl-C that cannot be lost while a person watches a training run (``study.train``).

Python turns SIGINT into a KeyboardInterrupt at the next bytecode the main thread runs. When that bytecode belongs
to a destructor (a tensor's, a progress bar's, any ``__del__`` or weakref callback run by the garbage collector),
Python prints "Exception ignored in …" and goes on: the Ctrl-C is gone and training runs to ``max_epochs``.
:func:`noting_ctrl_c` also notes the signal, so the trainer can stop at the end of the epoch it landed in even when
the exception itself was swallowed.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def noting_ctrl_c(active: bool = True) -> Iterator[threading.Event]:
    """Within the block, Ctrl-C still raises KeyboardInterrupt, and also sets the event this yields.

    Only Python's own handler is wrapped, and only on the main thread: a process that ignores SIGINT, or a host
    that installed its own handler (Ray's workers, a notebook), keeps its behaviour, and the event stays unset, as
    it does when not ``active``.
    """
    pressed = threading.Event()
    if (not active or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield pressed
        return

    def note_then_raise(signum: int, frame: Any) -> None:
        pressed.set()
        signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGINT, note_then_raise)
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
