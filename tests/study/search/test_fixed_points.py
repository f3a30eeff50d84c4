"""Fixed-point runs (study.replicate) get the sweep's kind of trial id, and a resumed run starts each point once.

A real Tune run on a local Ray (2 CPUs, no dashboard) with a trainable that only reports its config: the trial ids
come from Tune itself, through :func:`study.search.generator.fixed_points_search`, as the sweep's come through its
Optuna searcher.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest

POINTS = [{"lr": 0.001, "seed": 1}, {"lr": 0.001, "seed": 2}, {"lr": 0.01, "seed": 1}]
SWEEP_ID = re.compile(r"[0-9a-f]{8}")  # Tune's Trial.generate_id(), which the sweep's trials get


@pytest.fixture(scope="module")
def ray_session():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _trainable(interrupt: Path | None = None) -> Any:
    """A trainable that reports its point; defined inside a function, so that Ray ships it by value to workers
    that cannot import this test module. With ``interrupt``, the first trial to start sends the driver the Ctrl-C
    of an interrupted batch (once: the file marks that it did) and waits to be stopped."""
    driver = os.getpid()

    def report(config: dict[str, Any]) -> None:
        from ray import tune

        if interrupt is not None and not interrupt.exists():
            interrupt.touch()
            os.kill(driver, signal.SIGINT)
            time.sleep(120)
        tune.report({"seed": config["seed"]})

    return report


def _tuner(path: Path, interrupt: Path | None = None) -> Any:
    from ray import tune

    from study.search.generator import fixed_points_search
    from study.search.searcher import points_space

    # what runner._drive gives Tune for a fixed-points run, with this module's search algorithm
    return tune.Tuner(_trainable(interrupt), param_space=points_space(POINTS),
                      tune_config=tune.TuneConfig(search_alg=fixed_points_search(POINTS, max_concurrent=1),
                                                  num_samples=len(POINTS), reuse_actors=True),
                      run_config=tune.RunConfig(name="tune", storage_path=str(path), verbose=0))


def _ran(results: Any) -> list[tuple[str, tuple[float, int]]]:
    """(trial id, point) of every trial that reported."""
    return [(result.metrics["trial_id"], (result.config["lr"], result.config["seed"])) for result in results
            if "seed" in result.metrics]


def _points() -> list[tuple[float, int]]:
    return sorted((point["lr"], point["seed"]) for point in POINTS)


def test_fixed_points_run_once_each_under_sweep_style_ids(tmp_path: Path, ray_session) -> None:
    ran = _ran(_tuner(tmp_path).fit())
    assert sorted(point for _, point in ran) == _points()
    ids = [trial_id for trial_id, _ in ran]
    assert all(SWEEP_ID.fullmatch(trial_id) for trial_id in ids), ids  # not BasicVariantGenerator's 39e5d_00000
    assert len(set(ids)) == len(POINTS)


def test_a_resumed_fixed_points_run_starts_each_remaining_point_once(tmp_path: Path, ray_session) -> None:
    from ray import tune

    # Tune catches the Ctrl-C, saves its state and returns (the runner raises KeyboardInterrupt on it then)
    first = _tuner(tmp_path, interrupt=tmp_path / "interrupted").fit()
    assert len(first) == 1 and not _ran(first)  # one point started, none finished
    resumed = tune.Tuner.restore(str(tmp_path / "tune"), trainable=_trainable(), resume_unfinished=True)
    ran = _ran(resumed.fit())
    assert sorted(point for _, point in ran) == _points()  # every point once: none lost, none run twice
    assert all(SWEEP_ID.fullmatch(trial_id) for trial_id, _ in ran)
    assert first[0].metrics["trial_id"] in {trial_id for trial_id, _ in ran}  # the interrupted trial, resumed


def test_a_resumed_batch_runs_only_the_points_its_trials_did_not_take() -> None:
    """Tune may save its trials and the search's state apart (a kill between the two files): the points still to run
    are those no kept or recorded trial took, whichever trials those are, and an equal point counts once each."""
    from ray.tune.search import Searcher

    from study.search.searcher import FixedPoints

    points = FixedPoints([*POINTS, POINTS[0]])
    points.resume_without([dict(POINTS[0]), dict(POINTS[2])])  # trials of the first and the third point
    assert [points.suggest(trial_id) for trial_id in "xyz"] == [POINTS[1], POINTS[0], Searcher.FINISHED]
    counted = FixedPoints([])
    counted.set_state({"points": POINTS, "given": 1})  # the state of a batch that counted the points it handed out
    assert [counted.suggest(trial_id) for trial_id in "xy"] == POINTS[1:]
