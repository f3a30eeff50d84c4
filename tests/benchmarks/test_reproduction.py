"""The reproduction report's verdicts: a claim or a published row holds exactly when its stated rule says so, and
the published-row studies run only on the datasets whose table they rerun."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from benchmarks.reproduction import (
    ARCHIVE,
    ARCHIVED_FILES,
    STUDY_DIR,
    archive_study,
    build_parser,
    check_run_overrides,
    finished_seeds,
    main,
    prepare_for_report,
    progress_line,
    restore_archive,
    run_study,
    sweep_overrides,
)
from benchmarks.reproduction_claims import (
    ABLATION_GROUPS,
    ABLATIONS,
    CLAIMS,
    MAIN_STUDIES,
    PUBLISHED,
    PUBLISHED_STUDIES,
)
from benchmarks.reproduction_report import (
    claim_lines,
    published_lines,
    trial_wall_s,
    unconverged,
)
from study.spec.yaml_io import read_yaml


def seeds(ndcg: list[float], hr: list[float] | None = None) -> pd.DataFrame:
    """One study's per-seed test metrics, indexed by seed as ``seed_values`` returns them."""
    hr = hr or [2 * value for value in ndcg]
    return pd.DataFrame({"test_ndcg@10": ndcg, "test_hr@10": hr, "test_mrr@10": [v / 2 for v in ndcg]},
                        index=pd.Index(range(1, len(ndcg) + 1), name="seed"))


def test_a_published_row_is_matched_within_five_percent_or_above() -> None:
    row = next(r for r in PUBLISHED if r.study == "sasrec-s3rec-bce" and r.dataset == "lastfm")
    just_inside = seeds([row.ndcg10 * 0.96] * 3)
    just_outside = seeds([row.ndcg10 * 0.94] * 3)
    above = seeds([row.ndcg10 * 1.30] * 3)
    for values, verdict in ((just_inside, "**holds**"), (just_outside, "**does not hold**"), (above, "**holds**")):
        [line] = published_lines("lastfm", {"sasrec-s3rec-bce": values})
        assert line.startswith(f"- {verdict}: sasrec-s3rec-bce within 5 %"), line
        assert f"NDCG@10 {row.ndcg10:.4f}" in line and "n = 3" in line


def test_the_ce_study_must_beat_the_row_and_each_dataset_uses_its_own_row() -> None:
    lastfm = next(r for r in PUBLISHED if r.study == "sasrec-s3rec-ce" and r.dataset == "lastfm")
    beauty = next(r for r in PUBLISHED if r.study == "sasrec-s3rec-ce" and r.dataset == "beauty")
    between = seeds([(lastfm.ndcg10 + beauty.ndcg10) / 2] * 2)  # above Beauty's row, below LastFM's
    [on_lastfm] = published_lines("lastfm", {"sasrec-s3rec-ce": between})
    [on_beauty] = published_lines("beauty", {"sasrec-s3rec-ce": between})
    assert on_lastfm.startswith("- **does not hold**") and on_beauty.startswith("- **holds**")
    assert published_lines("ml-100k", {"sasrec-s3rec-ce": between}) == []  # no published row for ml-100k


def test_a_diagnostic_study_is_set_against_the_row_without_a_verdict() -> None:
    row = next(r for r in PUBLISHED if r.kind == "diagnostic")
    for ratio in (0.5, 0.99, 1.2):  # far below, within 5 %, above: never a verdict
        [line] = published_lines(row.dataset, {row.study: seeds([row.ndcg10 * ratio] * 3)})
        assert line.startswith(f"- diagnostic, no verdict: {row.study} ({row.change})"), line
        assert "holds" not in line and f"ratio {ratio:.3f}" in line


def test_ratio_claims_hold_above_their_bound_and_better_claims_need_a_significant_gain() -> None:
    sasrec = seeds([0.050, 0.052, 0.054, 0.051, 0.053])
    bert_above = seeds([0.91 * v for v in sasrec["test_ndcg@10"]])
    bert_below = seeds([0.89 * v for v in sasrec["test_ndcg@10"]])
    ratio_claim = tuple(c for c in CLAIMS if c.candidate == "bert4rec")
    [line] = claim_lines({"sasrec": sasrec, "bert4rec": bert_above}, ratio_claim)
    assert line.startswith("- **holds**") and "ratio 0.910" in line
    [line] = claim_lines({"sasrec": sasrec, "bert4rec": bert_below}, ratio_claim)
    assert line.startswith("- **does not hold**") and "ratio 0.890" in line

    better_claim = tuple(c for c in CLAIMS if c.candidate == "hstu")
    clearly_better = seeds([v + 0.010 + 0.001 * i for i, v in enumerate(sasrec["test_ndcg@10"])])
    noisy = seeds([v + d for v, d in zip(sasrec["test_ndcg@10"], (0.004, -0.003, 0.002, -0.002, 0.001))])
    [line] = claim_lines({"sasrec": sasrec, "hstu": clearly_better}, better_claim)
    assert line.startswith("- **holds**"), line
    [line] = claim_lines({"sasrec": sasrec, "hstu": noisy}, better_claim)
    assert line.startswith("- **does not hold**") and "the test does not separate them" in line
    [line] = claim_lines({"sasrec": sasrec, "hstu": seeds(list(clearly_better["test_ndcg@10"])[:3])}, better_claim)
    assert "Welch t" in line and "paired" not in line and "n = 3 and 5" in line  # a study not yet at every seed


def test_every_published_study_has_a_study_file_and_can_be_chosen() -> None:
    assert {row.study for row in PUBLISHED} == set(PUBLISHED_STUDIES)
    assert {row.dataset for row in PUBLISHED} == {"lastfm", "beauty"}
    for study in PUBLISHED_STUDIES:
        assert (STUDY_DIR / f"{study}.yaml").is_file()
    assert build_parser().parse_args(["--studies", *PUBLISHED_STUDIES]).studies == list(PUBLISHED_STUDIES)


def test_every_study_has_a_file_and_each_ablation_sits_beside_its_full_model() -> None:
    for study in (*MAIN_STUDIES, *ABLATIONS):
        assert (STUDY_DIR / f"{study}.yaml").is_file(), study
    assert set(ABLATIONS) == {"elastic-mean-query", "elastic-no-imr", "elastic-no-dispatcher", "lisa-base-w16",
                              "bert4rec-last-item-samples", "bert4rec-dropout05", "bert4rec-long", "sasrec-last",
                              "bert4rec-sliding-windows", "cotten4rec-sliding-windows"}
    for model, group in ABLATION_GROUPS.items():
        assert group[0] in MAIN_STUDIES and group[0].startswith(model.lower())  # the full model heads its table


@pytest.mark.parametrize(("main_study", "ablation", "changes"), [
    ("bert4rec", "bert4rec-last-item-samples", {"cloze_last_item_samples": True}),
    # the whole-history windows, and BERT4Rec's output bias, which this study alone ran again with
    ("bert4rec", "bert4rec-sliding-windows", {"cloze_window_step": 5, "output_bias": True}),
    ("cotten4rec", "cotten4rec-sliding-windows", {"cloze_window_step": 5})])
def test_an_ablation_differs_from_its_full_model_by_the_keys_it_names(main_study: str, ablation: str,
                                                                     changes: dict[str, object]) -> None:
    main, _ = read_yaml(STUDY_DIR / f"{main_study}.yaml")
    changed, _ = read_yaml(STUDY_DIR / f"{ablation}.yaml")
    for key, value in changes.items():
        assert not main["fixed"].pop(key, None)  # off: each user's newest window, no samples, no bias
        assert changed["fixed"].pop(key) == value
    assert changed.pop("name") == f"repro-ml100k-{ablation}"
    main.pop("name")
    assert changed == main


def test_a_run_counts_as_still_improving_only_at_its_own_epoch_limit() -> None:
    # seed 1 stopped at the shared limit of 200 on its best epoch; seed 2 did the same in a study that gives 500
    # epochs (only its own limit of 500 counts); seed 3 ran into its limit past its best epoch
    runs = pd.DataFrame({"best_epoch": [200, 200, 380], "epochs_run": [200, 200, 500],
                         "config.max_epochs": [200, 500, 500]}, index=pd.Index([1, 2, 3], name="seed"))
    assert unconverged({"bert4rec-long": runs}, 200) == ["- bert4rec-long: seeds 1 were still improving at epoch 200"]
    runs.loc[3, "best_epoch"] = 500
    assert unconverged({"bert4rec-long": runs}, 200) == [
        "- bert4rec-long: seeds 1, 3 were still improving at epoch 200, 500"]
    assert unconverged({"sasrec": runs.drop(columns="config.max_epochs")}, 200) == [
        "- sasrec: seeds 1, 2, 3 were still improving at epoch 200, 500"]  # without the column: the shared 200


def test_a_run_the_limit_cut_before_its_patience_ran_out_is_listed() -> None:
    # LastFM's bert4rec seed 1: best epoch 165, stopped by the limit of 200 with 15 epochs of patience 50 left;
    # seed 4 ran out of patience at epoch 199, seed 2 at 60 (both early stops); seed 3 under the default patience 10;
    # the rows come out of seed order, the lines in it
    runs = pd.DataFrame({"best_epoch": [195, 10, 165, 149], "epochs_run": [200, 60, 200, 199],
                         "config.patience": [None, 50, 50, 50]}, index=pd.Index([3, 2, 1, 4], name="seed"))
    assert unconverged({"bert4rec": runs}, 200) == [
        "- bert4rec: seed 1 stopped at epoch 200, 35 epochs after its best, before its patience of 50 ran out",
        "- bert4rec: seed 3 stopped at epoch 200, 5 epochs after its best, before its patience of 10 ran out"]
    runs.loc[1, "best_epoch"] = 150  # 50 epochs without a better score: the early stop and the limit coincide
    assert unconverged({"bert4rec": runs}, 200) == [
        "- bert4rec: seed 3 stopped at epoch 200, 5 epochs after its best, before its patience of 10 ran out"]


def test_the_progress_line_reads_the_running_trials_epoch_files(tmp_path) -> None:
    folder = tmp_path / "repro-lastfm-bert4rec-long"
    (folder / "trials").mkdir(parents=True)
    assert progress_line(folder, 5).endswith("repro-lastfm-bert4rec-long: 0/5 seeds finished")
    epochs = [{"epoch": 1, "best_epoch": 1, "best_valid_ndcg@10": 0.0101},
              {"epoch": 2, "best_epoch": 1, "best_valid_ndcg@10": 0.0101},
              {"epoch": 3, "best_epoch": 3, "best_valid_ndcg@10": 0.0213}]
    (folder / "trials" / "a1b2c3d4.history.jsonl").write_text("".join(json.dumps(e) + "\n" for e in epochs))
    (folder / "trials" / "e5f6a7b8.history.jsonl").write_text("")  # a trial that has not finished an epoch
    pd.DataFrame({"status": ["ok", "ok", "error"], "seed": [1, 2, 3]}).to_parquet(folder / "trials.parquet")
    line = progress_line(folder, 5)
    assert line.endswith("repro-lastfm-bert4rec-long: 2/5 seeds finished; running: a1b2c3d4 at epoch 3 "
                         "(best epoch 3, validation NDCG@10 0.0213)"), line


def test_a_reproduction_override_may_change_where_a_study_runs_but_never_its_protocol() -> None:
    run = ["resources.gpu=0.2", "resources.cpu=1", "checkpoint.every=0"]
    assert check_run_overrides(run) == run
    assert sweep_overrides("lastfm", "sasrec", None, False, tuple(run))[2:] == run
    for changed in ("fixed.patience=50", "protocol.objective=bce", "budget.max_epochs=5", "search.seed={grid: [1]}",
                    "dataset.name=beauty"):
        with pytest.raises(ValueError, match="may change only resources"):
            check_run_overrides(["resources.gpu=0.2", changed])
    assert main(["--report-only", "--set", "fixed.patience=50"]) == 2  # refused before anything is written


def write_study(folder, seeds_ok: list[int]) -> None:
    """A finished study's files as the sweep writes them, plus the ones the archive leaves behind."""
    (folder / "trials").mkdir(parents=True)
    (folder / "models").mkdir()
    pd.DataFrame({"status": ["ok"] * len(seeds_ok), "seed": seeds_ok}).to_parquet(folder / "trials.parquet")
    pd.DataFrame({"epoch": [1, 2]}).to_parquet(folder / "history.parquet")
    (folder / "study.yaml").write_text(f"name: {folder.name}\n")
    (folder / "environment.json").write_text("{}")
    (folder / "trials" / "a1b2c3d4.json").write_text("{}")
    (folder / "models" / "model.pt").write_bytes(b"weights")


def test_the_archive_keeps_what_the_report_reads_and_a_fresh_clone_gets_it_back(tmp_path) -> None:
    results, archive = tmp_path / "results", tmp_path / "archive"
    write_study(results / "repro-ml100k-sasrec", [1, 2, 3, 4, 5])
    archive_study(results / "repro-ml100k-sasrec", archive)
    kept = sorted(p.name for p in (archive / "repro-ml100k-sasrec").iterdir())
    assert kept == sorted(ARCHIVED_FILES)  # no weights, no per-trial files, no Tune state
    clone = tmp_path / "clone-results"
    clone.mkdir()
    (clone / "repro-ml100k-gru4rec").mkdir()  # a study this machine already has is left alone
    assert restore_archive(archive, clone) == ["repro-ml100k-sasrec"]
    assert finished_seeds(clone / "repro-ml100k-sasrec") == 5
    assert restore_archive(archive, clone) == []  # already there: nothing is overwritten


def test_a_study_restored_in_part_is_reported_as_it_is_and_not_resumed(tmp_path, monkeypatch, capsys) -> None:
    import benchmarks.reproduction as reproduction

    monkeypatch.setattr(reproduction, "RESULTS", tmp_path)
    write_study(tmp_path / "repro-ml100k-elastic", [1, 2, 3])  # two seeds were lost with their machine
    monkeypatch.setattr(reproduction.subprocess, "Popen", lambda *a, **k: pytest.fail("a sweep was started"))
    args = build_parser().parse_args(["--studies", "elastic"])
    args.sources, args.out = {}, str(tmp_path / "report.md")
    assert run_study("ml-100k", "elastic", args) == tmp_path / "repro-ml100k-elastic"
    assert "holds 3 of 5 seeds but no Tune state" in capsys.readouterr().err


def test_the_tracked_archive_holds_only_the_compact_records() -> None:
    for folder in ARCHIVE.glob("repro-*"):
        assert {p.name for p in folder.iterdir()} <= set(ARCHIVED_FILES), folder
        assert finished_seeds(folder) >= 1, folder


def test_studies_run_in_the_order_given_and_are_reported_in_the_reports(tmp_path, monkeypatch) -> None:
    import benchmarks.reproduction as reproduction

    monkeypatch.setattr(reproduction, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(reproduction, "ARCHIVE", tmp_path / "archive")
    ran = []
    monkeypatch.setattr(reproduction, "run_study", lambda dataset, study, args: ran.append((dataset, study)))
    assert main(["--datasets", "ml-100k", "--studies", "fpmc", "elastic", "sasrec",
                 "--out", str(tmp_path / "report.md")]) == 0
    assert ran == [("ml-100k", "fpmc"), ("ml-100k", "elastic"), ("ml-100k", "sasrec")]


def test_a_report_with_no_results_leaves_the_page_as_it_is(tmp_path, monkeypatch) -> None:
    import benchmarks.reproduction as reproduction

    monkeypatch.setattr(reproduction, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(reproduction, "ARCHIVE", tmp_path / "archive")
    page = tmp_path / "report.md"
    page.write_text("# Reproduction\n\n<!-- generated: python -m benchmarks.reproduction -->\n| table |\n"
                    "<!-- end of generated part -->\n")
    before = page.read_text()
    assert main(["--report-only", "--out", str(page)]) == 0
    assert page.read_text() == before


def test_archiving_again_copies_only_the_records_that_changed(tmp_path) -> None:
    folder, archive = tmp_path / "results" / "repro-ml100k-sasrec", tmp_path / "archive"
    write_study(folder, [1, 2, 3, 4, 5])
    archive_study(folder, archive)
    kept = archive / folder.name / "trials.parquet"
    first = kept.stat().st_ctime_ns
    archive_study(folder, archive)
    assert kept.stat().st_ctime_ns == first  # unchanged: not rewritten
    pd.DataFrame({"status": ["ok"] * 6, "seed": [1, 2, 3, 4, 5, 6]}).to_parquet(folder / "trials.parquet")
    archive_study(folder, archive)
    assert finished_seeds(archive / folder.name) == 6  # changed: copied again


def test_the_report_prepares_a_given_dataset_where_study_report_reads_its_statistics(tmp_path, data_cache,
                                                                                      capsys) -> None:
    from study.data import list_prepared

    source = tmp_path / "LastFM.txt"  # S3Rec's format: a user, then their items in order
    source.write_text("".join(f"{user} " + " ".join(str(10 * user + i) for i in range(8)) + "\n"
                              for user in range(1, 7)))
    prepare_for_report("lastfm", None)  # no source: nothing to prepare (and nothing downloaded)
    assert list_prepared() == []
    prepare_for_report("lastfm", str(source))
    [(_, meta)] = list_prepared()
    assert (meta["num_users"], meta["num_items"], meta["max_len"]) == (6, 48, 50)
    prepare_for_report("lastfm", str(tmp_path / "missing.txt"))  # a wrong path costs the statistics, not the report
    assert "statistics are left out" in capsys.readouterr().err


def test_ctrl_c_waits_for_the_sweep_and_ends_with_one_line(tmp_path, monkeypatch, capsys) -> None:
    import benchmarks.reproduction as reproduction

    class InterruptedSweep:
        """A sweep during which the user presses Ctrl-C; it stops on its own (it got the SIGINT too)."""

        def __init__(self, *args, **kwargs) -> None:
            self.waits, self.signals = [], []

        def wait(self, timeout: float | None = None) -> int:
            self.waits.append(timeout)
            if len(self.waits) == 1:
                raise KeyboardInterrupt
            return 130

        def send_signal(self, number: int) -> None:
            self.signals.append(number)

    sweeps: list[InterruptedSweep] = []

    def start(*args, **kwargs) -> InterruptedSweep:
        sweeps.append(InterruptedSweep())
        return sweeps[-1]

    monkeypatch.setattr(reproduction, "RESULTS", tmp_path)
    monkeypatch.setattr(reproduction.subprocess, "Popen", start)
    assert main(["--datasets", "ml-100k", "--studies", "sasrec", "--quick"]) == 130
    [sweep] = sweeps
    assert len(sweep.waits) == 2 and sweep.signals == []  # waited for it to stop; no second SIGINT
    err = capsys.readouterr().err
    assert err.startswith("interrupted; rerun the same command") and "Traceback" not in err


def test_a_resumed_trial_counts_its_earlier_runs_in_the_wall_time(tmp_path) -> None:
    """Trial a ran whole (its row has the larger figure: it counts set-up too); trial b was stopped and resumed, and
    its row, written before the fix, counts only the last run, while its epochs' cumulative time counts both."""
    pd.DataFrame({"trial_id": ["a", "a", "b", "b"], "epoch": [1, 2, 1, 2],
                  "wall_time_s": [50.0, 100.0, 900.0, 1000.0]}).to_parquet(tmp_path / "history.parquet")
    runs = pd.DataFrame({"trial_id": ["a", "b"], "wall_time_s": [110.0, 300.0]})
    assert trial_wall_s(runs, tmp_path) == 110.0 + 1000.0
    assert trial_wall_s(runs, tmp_path / "no-history") == 410.0


def test_sigterm_stops_like_ctrl_c_and_passes_the_sweep_a_sigint(tmp_path, monkeypatch, capsys) -> None:
    """`kill PID` reaches this process alone (and a background run ignores SIGINT): the sweep is asked to stop with
    one SIGINT after the grace period, so that Tune saves its state, and the run ends with the same one line."""
    import os
    import signal
    import subprocess

    import benchmarks.reproduction as reproduction

    class KilledDriverSweep:
        def __init__(self) -> None:
            self.waits, self.signals = [], []

        def wait(self, timeout: float | None = None) -> int:
            self.waits.append(timeout)
            if len(self.waits) == 1:
                os.kill(os.getpid(), signal.SIGTERM)  # arrives while the driver waits for the sweep
            if len(self.waits) == 2:
                raise subprocess.TimeoutExpired("study.sweep", timeout)  # the sweep did not get it
            return 130

        def send_signal(self, number: int) -> None:
            self.signals.append(number)

    sweeps: list[KilledDriverSweep] = []
    monkeypatch.setattr(reproduction, "RESULTS", tmp_path)
    monkeypatch.setattr(reproduction.subprocess, "Popen", lambda *a, **k: sweeps.append(KilledDriverSweep())
                        or sweeps[-1])
    before = signal.getsignal(signal.SIGTERM)
    assert main(["--datasets", "ml-100k", "--studies", "sasrec", "--quick"]) == 130
    [sweep] = sweeps
    assert sweep.signals == [signal.SIGINT] and len(sweep.waits) == 3
    assert capsys.readouterr().err.startswith("interrupted; rerun the same command")
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is this command's only
