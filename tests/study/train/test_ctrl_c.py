"""Ctrl-C during a watched training run is never lost, even when Python swallows its KeyboardInterrupt in a
destructor; on synthetic data sized like LastFM (no ``../shared`` needed)."""

from __future__ import annotations

import os
import signal

import pytest

from study.train.ctrl_c import noting_ctrl_c
from study.train.trainer import TrialData, run_trial

# the point of these tests: Python reports each swallowed KeyboardInterrupt as "Exception ignored in …"
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


class SwallowsCtrlC:
    """Ctrl-C lands while this object is being freed: Python prints "Exception ignored in …" and goes on."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        total = 0
        for number in range(1000):  # bytecode for the handler to run on, still inside __del__
            total += number


@pytest.fixture
def python_ctrl_c():
    """Python's own SIGINT handler, as in a command run from a terminal (whatever the test runner installed)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_swallowed_by_a_destructor_is_still_noted(python_ctrl_c) -> None:
    SwallowsCtrlC()  # without the guard the Ctrl-C is simply gone: no exception reaches here
    with noting_ctrl_c() as pressed:
        assert not pressed.is_set()
        SwallowsCtrlC()
        assert pressed.is_set()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back as it was
    with noting_ctrl_c(active=False) as ignored:
        SwallowsCtrlC()
        assert not ignored.is_set()


def test_a_run_whose_ctrl_c_was_swallowed_stops_after_that_epoch(python_ctrl_c, synthetic_lastfm_prepared,
                                                                   capsys: pytest.CaptureFixture) -> None:
    data = TrialData.from_prepared(synthetic_lastfm_prepared, max_len=20)

    def at_epoch(report) -> None:
        if report.epoch == 2:
            SwallowsCtrlC()

    result = run_trial("sasrec", data, {"max_epochs": 6, "batch_size": 256, "measure_efficiency": False,
                                        "num_threads": 1, "max_len": 20, "patience": 0, "window_step": 0},
                       callback=at_epoch, progress=True)
    assert result["status"] == "interrupted" and result["epochs_run"] == 2
    assert "interrupted during epoch 3: the result below is that of the 2 finished epoch(s)" in capsys.readouterr().err
