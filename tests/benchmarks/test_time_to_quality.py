"""The time-to-quality benchmark's target comes from the campaign's committed records, and its clock stops at the
first epoch whose reported test figure reaches it."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from benchmarks.time_to_quality import (
    RECORDS,
    WAYS,
    Progress,
    TargetReached,
    campaign_reference,
    median_time,
    settings_of,
)


def test_the_target_is_the_campaigns_sasrec_last_mean() -> None:
    rows = pd.read_parquet(RECORDS / "repro-ml100k-sasrec-last" / "trials.parquet")
    assert campaign_reference("ml-100k") == pytest.approx(rows["test_ndcg@10"].mean())
    with pytest.raises(SystemExit, match="give --reference"):
        campaign_reference("no-such-dataset")


def test_the_clock_stops_at_the_first_epoch_that_reaches_the_target() -> None:
    progress = Progress()
    for wall, test in [(10.0, 0.03), (20.0, 0.061), (30.0, 0.05), (40.0, 0.07)]:
        progress(SimpleNamespace(wall_time_s=wall, best_test={"ndcg@10": test}))
    assert progress.reached(0.06) == 20.0 and progress.reached(0.08) is None
    assert WAYS["newest"] == {"window_step": 0} and WAYS["last"] == {"objective": "last"}
    assert WAYS["history-decay"]["lr_decay_patience"] == 3 and WAYS["history-decay"]["window_targets"] == "shifting"
    assert WAYS["history-warmup"]["lr_warmup_steps"] == 110 and WAYS["history-warmup"]["window_targets"] == "new"
    # a way that names no schedule trains at the constant rate its records ran with, not at SASRec's schedule
    ways = ("history", "history-decay", "history-warmup")
    assert [settings_of(way)["lr_warmup_steps"] for way in ways] == [0, 0, 110]
    assert settings_of("history")["lr"] == 1e-3 and settings_of("history-decay")["lr"] == 3e-3


def test_until_target_ends_the_run_at_the_epoch_that_reaches_it() -> None:
    progress = Progress(stop_at=0.06)
    progress(SimpleNamespace(wall_time_s=10.0, best_test={"ndcg@10": 0.03}))
    with pytest.raises(TargetReached):
        progress(SimpleNamespace(wall_time_s=20.0, best_test={"ndcg@10": 0.061}))
    assert progress.epochs == [(10.0, 0.03), (20.0, 0.061)] and progress.reached(0.06) == 20.0


def test_a_seed_that_never_reaches_the_target_counts_as_never_in_the_median() -> None:
    assert median_time([127.0, 124.0, None]) == 127.0
    assert median_time([None, 500.0, None]) is None
    assert median_time([None, 300.0]) is None and median_time([200.0, 300.0]) == 250.0
