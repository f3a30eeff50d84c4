"""``python -m study.campaign``: the campaign file is checked before anything runs, studies run resumably in the
order asked, their compact records travel with the repository, and Ctrl-C or SIGTERM leave a resumable run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

import study.campaign.runner as runner
from study.campaign.command import main, prepare_for_report
from study.campaign.page import BEGIN, END, results_table, trial_wall_s, unconverged, write_page
from study.campaign.runner import (
    RECORD_FILES,
    archive_study,
    check_run_overrides,
    choose,
    finished_seeds,
    progress_line,
    restore_records,
    run_study,
    sweep_overrides,
)
from study.campaign.spec import load_campaign
from study.errors import UserError
from study.layout import LOCK_FILE
from study.search.lock import study_lock
from study.spec.yaml_io import StudyConfigError

CAMPAIGN = """\
name: Toy
prefix: toy
seeds: 3
reference: a
studies: [a, b, c]
ablations:
  A: [a, a-variant]
datasets:
  small: {recipe: ml-100k, source: small.txt, download: true}
  other:
    recipe: lastfm
    source: other.txt
    studies: [a]
    choose: {count: 1, from: [b, c], ratio_to: a, over: [small]}
claims:
  - {text: B outperforms A, source: paper, candidate: b, reference: a, kind: better}
  - {text: above the row, source: table, candidate: p, kind: beat, dataset: other,
     published: {test_hr@10: 0.1, test_ndcg@10: 0.05}}
"""


@pytest.fixture
def campaign_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A toy campaign with its study files; the working folder (where results/ goes) is ``tmp_path``."""
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "toy"
    home.mkdir()
    for study in ("a", "a-variant", "b", "c", "p"):
        (home / f"{study}.yaml").write_text(f"name: {study}\nmodel: {study[0]}\nfixed: {{max_len: 50}}\n")
    (home / "campaign.yaml").write_text(CAMPAIGN)
    return home / "campaign.yaml"


def write_study(folder: Path, seeds_ok: list[int], ndcg: float = 0.05) -> None:
    """A finished study's files as the sweep writes them, plus the ones the records leave behind."""
    (folder / "trials").mkdir(parents=True)
    (folder / "models").mkdir()
    pd.DataFrame({"status": ["ok"] * len(seeds_ok), "seed": seeds_ok,
                  "test_ndcg@10": [ndcg] * len(seeds_ok)}).to_parquet(folder / "trials.parquet")
    pd.DataFrame({"epoch": [1, 2]}).to_parquet(folder / "history.parquet")
    (folder / "study.yaml").write_text(f"name: {folder.name}\n")
    (folder / "environment.json").write_text("{}")
    (folder / "trials" / "a1b2c3d4.json").write_text("{}")
    (folder / "models" / "model.pt").write_bytes(b"weights")


def test_a_campaign_file_resolves_its_studies_datasets_and_claims(campaign_file: Path) -> None:
    campaign = load_campaign(campaign_file)
    assert campaign.ablation_studies == ("a-variant",) and campaign.published_studies == ("p",)
    assert campaign.all_studies() == ("a", "b", "c", "a-variant", "p")
    assert campaign.datasets["small"].studies == ("a", "b", "c", "a-variant")  # the default: main and ablations
    assert campaign.published_on("other") == ("p",) and campaign.published_on("small") == ()
    assert campaign.study_name("small", "a") == "toy-small-a"
    assert campaign.page == campaign_file.parent / "README.md"
    assert dict(campaign.claims[1].published) == {"test_hr@10": 0.1, "test_ndcg@10": 0.05}


def test_every_problem_of_a_campaign_file_is_one_error_line(campaign_file: Path, capsys) -> None:
    text = CAMPAIGN.replace("kind: better", "kind: larger").replace("seeds: 3", "seeds: 3\nlabel: x")
    campaign_file.write_text(text.replace("studies: [a, b, c]", "studies: [a, b, c, d]"))
    with pytest.raises(StudyConfigError) as error:
        load_campaign(campaign_file)
    problems = error.value.lines()
    assert len(problems) == 3, problems
    assert any(":4: label: unknown key" in p for p in problems)
    assert any("claims[0].kind: unknown kind 'larger'" in p for p in problems)
    assert any("d: no study file" in p for p in problems)
    assert main([str(campaign_file), "--report-only"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and all(line.startswith("error: ") for line in err)


def test_a_published_row_needs_its_dataset_and_the_judged_metric(campaign_file: Path) -> None:
    campaign_file.write_text(CAMPAIGN.replace("dataset: other,", "").replace("test_ndcg@10: 0.05", "test_mrr@10: 0"))
    with pytest.raises(StudyConfigError) as error:
        load_campaign(campaign_file)
    assert [p.split(": ", 1)[1] for p in error.value.lines()] == [
        "claims[1].dataset: required", "claims[1].metrics: test_ndcg@10 (the judged metric) has no published value"]


def test_a_claim_may_state_the_papers_effect_and_its_role(campaign_file: Path) -> None:
    stated = CAMPAIGN.replace("kind: better}", "kind: better, paper_effect: 0.073, role: primary}")
    campaign_file.write_text(stated)
    claim = load_campaign(campaign_file).claims[0]
    assert claim.paper_effect == pytest.approx(0.073) and claim.role == "primary"
    assert load_campaign(campaign_file).claims[1].paper_effect is None
    wrong = stated.replace("0.073", "big").replace("primary", "main")
    campaign_file.write_text(wrong.replace("kind: beat,", "kind: beat, paper_effect: 1,"))
    with pytest.raises(StudyConfigError) as error:
        load_campaign(campaign_file)
    assert [p.split(": ", 1)[1] for p in error.value.lines()] == [
        "claims[0].paper_effect: expected a number (e.g. 0.07 for +7 %), got 'big'",
        "claims[0].role: unknown role 'main'; one of primary, secondary",
        "claims[1].paper_effect: a published row's claim has no paper effect: the row is the paper's"]


def test_a_claim_waiting_for_a_study_says_so_where_the_study_belongs(campaign_file: Path) -> None:
    from study.campaign.page import unrun_claim_lines

    campaign = load_campaign(campaign_file)
    ran = {"a": pd.DataFrame({"test_ndcg@10": [0.05]})}
    assert unrun_claim_lines(campaign, "small", ran) == [
        "- **not run yet**: B outperforms A (paper). No records of b on small: `python -m study.campaign "
        "campaign.yaml` runs them."]
    assert unrun_claim_lines(campaign, "other", ran) == []  # b is not one of that dataset's studies
    assert unrun_claim_lines(campaign, "small", {**ran, "b": ran["a"]}) == []  # both ran: claim_lines judges it


def test_an_override_may_change_where_a_study_runs_but_never_its_protocol(campaign_file: Path, capsys) -> None:
    run = ["resources.gpu=0.2", "resources.cpu=1", "checkpoint.every=0"]
    assert check_run_overrides(run) == run
    campaign = load_campaign(campaign_file)
    assert sweep_overrides(campaign, "small", "a", None, False, tuple(run)) == [
        "name=toy-small-a", "dataset.name=ml-100k", *run]
    for changed in ("fixed.patience=50", "protocol.objective=bce", "budget.max_epochs=5", "dataset.name=beauty"):
        with pytest.raises(UserError, match="may change only resources"):
            check_run_overrides(["resources.gpu=0.2", changed])
    assert main([str(campaign_file), "--report-only", "--set", "fixed.patience=50"]) == 2
    assert main([str(campaign_file), "--studies", "z"]) == 2
    assert "--studies z: not in" in capsys.readouterr().err
    assert not (campaign_file.parent / "README.md").exists()  # refused before anything is written


def test_the_records_keep_what_the_report_reads_and_a_fresh_clone_gets_them_back(tmp_path: Path) -> None:
    results, records = tmp_path / "results", tmp_path / "records"
    write_study(results / "toy-small-a", [1, 2, 3])
    archive_study(results / "toy-small-a", records)
    assert sorted(p.name for p in (records / "toy-small-a").iterdir()) == sorted(RECORD_FILES)
    clone = tmp_path / "clone-results"
    clone.mkdir()
    (clone / "toy-small-b").mkdir()  # a study this machine already has is left alone
    assert restore_records(records, clone, "toy") == ["toy-small-a"]
    assert finished_seeds(clone / "toy-small-a") == 3
    assert restore_records(records, clone, "toy") == []  # already there: nothing is overwritten
    assert restore_records(records, tmp_path / "elsewhere", "other") == []  # another campaign's prefix


def test_recording_again_copies_only_the_records_that_changed(tmp_path: Path) -> None:
    folder, records = tmp_path / "results" / "toy-small-a", tmp_path / "records"
    write_study(folder, [1, 2, 3])
    archive_study(folder, records)
    kept = records / folder.name / "trials.parquet"
    first = kept.stat().st_ctime_ns
    archive_study(folder, records)
    assert kept.stat().st_ctime_ns == first  # unchanged: not rewritten
    pd.DataFrame({"status": ["ok"] * 4, "seed": [1, 2, 3, 4]}).to_parquet(folder / "trials.parquet")
    archive_study(folder, records)
    assert finished_seeds(records / folder.name) == 4  # changed: copied again


def test_a_study_another_sweep_is_running_is_not_recorded_until_it_ends(tmp_path: Path, capsys) -> None:
    folder, records = tmp_path / "results" / "toy-small-a", tmp_path / "records"
    write_study(folder, [1, 2])
    with study_lock(folder, "toy-small-a"):  # this process stands for the other campaign's sweep
        archive_study(folder, records)
    assert not (records / folder.name).exists()
    assert f"since a sweep is still running it (process {os.getpid()} on" in capsys.readouterr().err
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (folder / LOCK_FILE).write_text(json.dumps({"host": socket.gethostname(), "pid": int(dead.stdout),
                                                "started_at": time.time() - 60}))
    archive_study(folder, records)  # a lock left by a killed sweep does not hold the records back
    assert finished_seeds(records / folder.name) == 2


def options(**given) -> object:
    from types import SimpleNamespace

    defaults = {"quick": False, "rerun": [], "overrides": [], "num_cpus": None, "progress_every": 600, "sources": {}}
    return SimpleNamespace(**{**defaults, **given})


def test_a_study_restored_in_part_is_reported_as_it_is_and_not_resumed(campaign_file: Path, monkeypatch,
                                                                       capsys) -> None:
    write_study(Path("results/toy-small-b"), [1, 2])  # one seed was lost with its machine
    monkeypatch.setattr(runner.subprocess, "Popen", lambda *a, **k: pytest.fail("a sweep was started"))
    folder = run_study(load_campaign(campaign_file), "small", "b", options())
    assert folder == Path.cwd() / "results" / "toy-small-b"
    assert "holds 2 of 3 seeds but no Tune state" in capsys.readouterr().err
    write_study(Path("results/toy-small-c"), [1, 2, 3])
    assert run_study(load_campaign(campaign_file), "small", "c", options()).name == "toy-small-c"  # done


class FinishedSweep:
    """A sweep that writes its study's three seeds and ends; records the command it was started with."""

    def __init__(self, command: list[str], folder: Path) -> None:
        self.command, self.returncode = command, 0
        write_study(folder, [1, 2, 3], ndcg=0.07)

    def wait(self, timeout: float | None = None) -> int:
        return 0


def test_rerun_runs_a_finished_study_again_once_and_keeps_the_earlier_run(campaign_file: Path, monkeypatch,
                                                                          capsys) -> None:
    folder, records = Path.cwd() / "results" / "toy-small-c", campaign_file.parent / "runs"
    write_study(folder, [1, 2, 3])
    archive_study(folder, records)
    sweeps: list[FinishedSweep] = []
    monkeypatch.setattr(runner.subprocess, "Popen", lambda command: sweeps.append(FinishedSweep(command, folder))
                        or sweeps[-1])
    rerun = [str(campaign_file), "--datasets", "small", "--rerun", "c"]
    assert main(rerun) == 0
    [sweep] = sweeps
    assert "--resume" not in sweep.command  # from scratch, in a new folder
    [earlier] = folder.parent.glob("toy-small-c.replaced-*")
    assert (earlier / "models" / "model.pt").is_file()  # the earlier run is kept whole, weights too
    assert pd.read_parquet(records / folder.name / "trials.parquet")["test_ndcg@10"].eq(0.07).all()  # replaced
    assert "running again from scratch (--rerun); the earlier run is kept in" in capsys.readouterr().out
    assert main(rerun) == 0  # the same command again continues the new run: it is done, nothing runs
    assert len(sweeps) == 1 and "already rerun" in capsys.readouterr().out
    shutil.rmtree(folder)  # a fresh clone of the repository: the earlier run's records are not restored over it
    assert restore_records(records, folder.parent, "toy") == []


SASREC_STUDY = """\
name: c
model: sasrec
dataset: {name: ml-100k}
protocol: {objective: auto, eval_mode: full, sampled_test_negatives: 0}
fixed: {max_len: 50, lr: 1.0e-3, patience: 10}
search: {seed: {grid: [1, 2, 3]}}
"""


def write_sasrec_rows(folder: Path) -> None:
    """A finished SASRec study whose schema-3 rows ran before sampled_test_negatives existed (so with 0), at
    patience 10 and ``objective: auto`` resolved to bce."""
    write_study(folder, [1, 2, 3])
    ran = {"objective": "bce", "eval_mode": "full", "max_len": 50, "lr": 0.001, "patience": 10}
    rows = pd.read_parquet(folder / "trials.parquet")
    rows.assign(model="sasrec", schema=3, config=json.dumps(ran)).to_parquet(folder / "trials.parquet")


def test_a_finished_study_whose_file_changed_since_it_ran_says_so_and_how_to_rerun(campaign_file: Path, monkeypatch,
                                                                                   capsys) -> None:
    write_sasrec_rows(Path.cwd() / "results" / "toy-small-c")
    study_file = campaign_file.parent / "c.yaml"
    study_file.write_text(SASREC_STUDY)
    monkeypatch.setattr(runner.subprocess, "Popen", lambda *a, **k: pytest.fail("a sweep was started"))
    run_study(load_campaign(campaign_file), "small", "c", options())
    assert capsys.readouterr().err == ""  # "auto" became bce, 1.0e-3 is 0.001, and the added setting ran 0
    study_file.write_text(SASREC_STUDY.replace("sampled_test_negatives: 0", "sampled_test_negatives: 100")
                          .replace("patience: 10", "patience: 50"))
    run_study(load_campaign(campaign_file), "small", "c", options())
    assert ("its study file has changed since it ran (patience 50 (ran 10); sampled_test_negatives 100 (ran 0)), "
            "so its results are the earlier settings'. --rerun c runs it again") in capsys.readouterr().err


def test_report_only_names_the_reported_studies_whose_file_changed_since_they_ran(campaign_file: Path,
                                                                                  capsys) -> None:
    write_sasrec_rows(Path.cwd() / "results" / "toy-small-c")
    study_file = campaign_file.parent / "c.yaml"
    study_file.write_text(SASREC_STUDY)
    assert main([str(campaign_file), "--report-only"]) == 0
    assert "changed" not in capsys.readouterr().err
    study_file.write_text(SASREC_STUDY.replace("patience: 10", "patience: 50"))
    assert main([str(campaign_file), "--report-only"]) == 0
    assert ("toy-small-c: its study file has changed since it ran (patience 50 (ran 10))"
            in capsys.readouterr().err)


def test_rerun_is_refused_where_it_cannot_mean_what_it_says(campaign_file: Path, capsys) -> None:
    for argv, message in ((["--rerun", "z"], "--rerun z: not in"),
                          (["--studies", "a", "--rerun", "c"], "--rerun c: not among --studies a"),
                          (["--rerun", "c", "--report-only"], "--rerun runs studies")):
        assert main([str(campaign_file), *argv]) == 2
        assert message in capsys.readouterr().err
    folder = Path.cwd() / "results" / "toy-small-c"
    write_study(folder, [1, 2, 3])
    with study_lock(folder, "toy-small-c"):  # another campaign is running it
        assert main([str(campaign_file), "--datasets", "small", "--rerun", "c"]) == 2
    assert "--rerun toy-small-c: a sweep is still running it" in capsys.readouterr().err
    assert not list(folder.parent.glob("*.replaced-*"))


def test_studies_run_in_the_order_given_and_only_where_they_belong(campaign_file: Path, monkeypatch) -> None:
    ran = []
    monkeypatch.setattr("study.campaign.command.run_study", lambda c, dataset, study, o: ran.append((dataset, study)))
    assert main([str(campaign_file), "--studies", "c", "p", "a", "--data-root", "/data"]) == 0
    # small: c then a (p has no row there); other: a (its choice waits for b and c on small), then p
    assert ran == [("small", "c"), ("small", "a"), ("other", "p"), ("other", "a")]
    ran.clear()
    assert main([str(campaign_file), "--datasets", "other"]) == 0  # no data root: other cannot run
    assert ran == []


def test_a_choice_waits_for_every_candidate_then_takes_the_best_ratios(campaign_file: Path) -> None:
    campaign = load_campaign(campaign_file)
    choice = campaign.datasets["other"].choose
    write_study(Path("results/toy-small-a"), [1, 2, 3], ndcg=0.05)
    write_study(Path("results/toy-small-b"), [1, 2, 3], ndcg=0.04)
    assert choose(campaign, choice, quick=False) == []  # c has not run
    write_study(Path("results/toy-small-c"), [1, 2], ndcg=0.06)
    assert choose(campaign, choice, quick=False) == []  # c has not every seed
    (Path("results/toy-small-c") / "trials.parquet").unlink()
    pd.DataFrame({"status": ["ok"] * 3, "seed": [1, 2, 3],
                  "test_ndcg@10": [0.06] * 3}).to_parquet("results/toy-small-c/trials.parquet")
    assert choose(campaign, choice, quick=False) == ["c"]


def test_a_page_keeps_its_hand_written_text_and_no_results_leave_it_alone(campaign_file: Path) -> None:
    page = campaign_file.parent / "README.md"
    page.write_text(f"# Toy\n\nreading\n\n{BEGIN}\n| old |\n{END}\n\nmore reading\n")
    before = page.read_text()
    assert main([str(campaign_file), "--report-only"]) == 0
    assert page.read_text() == before
    write_page(["## small", "", "| new |"], page, "Toy")
    assert page.read_text() == f"# Toy\n\nreading\n\n{BEGIN}\n## small\n\n| new |\n{END}\n\nmore reading\n"
    fresh = campaign_file.parent / "fresh.md"
    write_page(["x"], fresh, "Toy")
    assert fresh.read_text() == f"# Toy\n\n{BEGIN}\nx\n{END}\n"


def test_finished_studies_without_their_reference_say_why_no_comparison_is_reported(campaign_file: Path,
                                                                                      capsys) -> None:
    """A --quick or --studies run that left out the reference study finishes its studies and writes no page: one
    line says why, so the finished studies do not read as lost."""
    write_study(Path("results/toy-small-b"), [1, 2, 3])
    page = campaign_file.parent / "README.md"
    assert main([str(campaign_file), "--report-only"]) == 0
    err = capsys.readouterr().err
    assert ("small: no comparison reported: the reference study 'a' has no finished seed; run it with the others "
            "(--studies a …)") in err
    assert f"nothing to report; {page} is left as it is" in err and not page.exists()
    write_study(Path("results/toy-small-a"), [1, 2, 3])
    Path("results/toy-small-b/trials.parquet").unlink()  # b is no longer finished; the reference alone is
    assert main([str(campaign_file), "--report-only"]) == 0
    assert "small: no comparison reported: only the reference study 'a' has finished seeds" in capsys.readouterr().err


def test_the_progress_line_reads_the_running_trials_epoch_files(tmp_path: Path) -> None:
    folder = tmp_path / "toy-small-a"
    (folder / "trials").mkdir(parents=True)
    assert progress_line(folder, 5).endswith("toy-small-a: 0/5 seeds finished")
    epochs = [{"epoch": 1, "best_epoch": 1, "best_valid_ndcg@10": 0.0101},
              {"epoch": 3, "best_epoch": 3, "best_valid_ndcg@10": 0.0213}]
    (folder / "trials" / "a1b2c3d4.history.jsonl").write_text("".join(json.dumps(e) + "\n" for e in epochs))
    (folder / "trials" / "e5f6a7b8.history.jsonl").write_text("")  # a trial that has not finished an epoch
    pd.DataFrame({"status": ["ok", "ok", "error"], "seed": [1, 2, 3]}).to_parquet(folder / "trials.parquet")
    assert progress_line(folder, 5).endswith("toy-small-a: 2/5 seeds finished; running: a1b2c3d4 at epoch 3 "
                                             "(best epoch 3, validation NDCG@10 0.0213)")


def test_a_run_counts_as_still_improving_only_at_its_own_epoch_limit() -> None:
    # seed 1 stopped at the shared limit of 200 on its best epoch; seed 2 did the same in a study that gives 500
    runs = pd.DataFrame({"best_epoch": [200, 200, 380], "epochs_run": [200, 200, 500],
                         "config.max_epochs": [200, 500, 500]}, index=pd.Index([1, 2, 3], name="seed"))
    assert unconverged({"long": runs}, 200) == ["- long: seeds 1 were still improving at epoch 200"]
    runs.loc[3, "best_epoch"] = 500
    assert unconverged({"long": runs}, 200) == ["- long: seeds 1, 3 were still improving at epoch 200, 500"]
    assert unconverged({"a": runs.drop(columns="config.max_epochs")}, 200) == [
        "- a: seeds 1, 2, 3 were still improving at epoch 200, 500"]  # without the column: the shared limit


def test_a_run_the_limit_cut_before_its_patience_ran_out_is_listed() -> None:
    runs = pd.DataFrame({"best_epoch": [195, 10, 165, 149], "epochs_run": [200, 60, 200, 199],
                         "config.patience": [None, 50, 50, 50]}, index=pd.Index([3, 2, 1, 4], name="seed"))
    assert unconverged({"b": runs}, 200) == [
        "- b: seed 1 stopped at epoch 200, 35 epochs after its best, before its patience of 50 ran out",
        "- b: seed 3 stopped at epoch 200, 5 epochs after its best, before its patience of 10 ran out"]


def test_a_table_shows_sampled_test_metrics_beside_the_full_rankings_where_a_study_recorded_them() -> None:
    def runs(**columns: list) -> pd.DataFrame:
        base = {"objective": ["bce"] * 2, "best_epoch": [10, 20], "epochs_run": [60, 70], "epoch_time_s": [2.0, 4.0],
                "test_ndcg@10": [0.03, 0.04], "test_hr@10": [0.08, 0.09]}
        return pd.DataFrame({**base, **columns}, index=pd.Index([1, 2], name="seed"))

    full_only = {"a": runs(), "b": runs()}
    header, _, first, _ = results_table(full_only, ("test_hr@10", "test_ndcg@10"))
    assert header == "| study | objective | seeds | HR@10 | NDCG@10 | best epoch (of run) | s/epoch |"
    assert first == "| a | bce | 2 | 0.0850 ± 0.0071 | 0.0350 ± 0.0071 | 15 (65) | 3.0 |"
    # as a campaign's page reads them: one study recorded sampled NDCG@10, the other has the column as NaN
    mixed = {"a": runs(**{"test_sampled_ndcg@10": [0.20, 0.30]}),
             "b": runs(**{"test_sampled_ndcg@10": [float("nan")] * 2})}
    header, _, first, second = results_table(mixed, ("test_hr@10", "test_ndcg@10"))
    assert header.endswith("| HR@10 | NDCG@10 | sampled NDCG@10 | best epoch (of run) | s/epoch |")
    assert "| 0.0350 ± 0.0071 | 0.2500 ± 0.0707 | 15 (65) |" in first and "| 0.0350 ± 0.0071 | – | 15 (65) |" in second


def test_a_resumed_trial_counts_its_earlier_runs_in_the_wall_time(tmp_path: Path) -> None:
    pd.DataFrame({"trial_id": ["a", "a", "b", "b"], "epoch": [1, 2, 1, 2],
                  "wall_time_s": [50.0, 100.0, 900.0, 1000.0]}).to_parquet(tmp_path / "history.parquet")
    runs = pd.DataFrame({"trial_id": ["a", "b"], "wall_time_s": [110.0, 300.0]})
    assert trial_wall_s(runs, tmp_path) == 110.0 + 1000.0
    assert trial_wall_s(runs, tmp_path / "no-history") == 410.0


def test_the_page_prepares_a_given_dataset_where_study_report_reads_its_statistics(campaign_file: Path, data_cache,
                                                                                    capsys) -> None:
    from study.data import list_prepared

    source = campaign_file.parent / "LastFM.txt"  # S3Rec's format: a user, then their items in order
    source.write_text("".join(f"{user} " + " ".join(str(10 * user + i) for i in range(8)) + "\n"
                              for user in range(1, 7)))
    campaign = load_campaign(campaign_file)
    prepare_for_report(campaign, "other", None)  # no source: nothing to prepare (and nothing downloaded)
    assert list_prepared() == []
    prepare_for_report(campaign, "other", source)
    [(_, meta)] = list_prepared()
    assert (meta["num_users"], meta["num_items"], meta["max_len"]) == (6, 48, 50)
    prepare_for_report(campaign, "other", source.parent / "missing.txt")  # costs the statistics, not the page
    assert "statistics are left out" in capsys.readouterr().err


class InterruptedSweep:
    """A sweep stopped by a SIGINT that the driver never got (a campaign in the background ignores SIGINT)."""

    def __init__(self, command: list[str], returncode: int) -> None:
        self.command, self.returncode = command, returncode

    def wait(self, timeout: float | None = None) -> int:
        return self.returncode


@pytest.mark.parametrize("returncode", [130, -signal.SIGINT, -signal.SIGTERM])
def test_a_sweep_stopped_by_a_signal_stops_the_campaign_as_interrupted(campaign_file: Path, monkeypatch, capsys,
                                                                       returncode: int) -> None:
    write_study(Path("results/toy-small-a"), [1, 2, 3])  # a reference with every seed: a page could be written
    sweeps: list[InterruptedSweep] = []
    monkeypatch.setattr(runner.subprocess, "Popen",
                        lambda command: sweeps.append(InterruptedSweep(command, returncode)) or sweeps[-1])
    assert main([str(campaign_file), "--datasets", "small", "--studies", "b", "c"]) == 130
    assert [sweep.command[3].rsplit("/", 1)[-1] for sweep in sweeps] == ["b.yaml"]  # c is not started
    assert "--no-resume-line" in sweeps[0].command  # the campaign's line below is the one to follow
    err = capsys.readouterr().err
    assert err.startswith("interrupted; rerun the same command") and "failed" not in err
    assert not load_campaign(campaign_file).page.exists()  # nothing reported from the half-run study


class Sweep:
    """A sweep during which the user presses Ctrl-C (``signal_self``: the driver alone gets a SIGTERM)."""

    def __init__(self, signal_self: bool) -> None:
        self.signal_self, self.waits, self.signals = signal_self, [], []

    def wait(self, timeout: float | None = None) -> int:
        self.waits.append(timeout)
        if len(self.waits) == 1:
            if not self.signal_self:
                raise KeyboardInterrupt
            os.kill(os.getpid(), signal.SIGTERM)  # arrives while the driver waits for the sweep
        if len(self.waits) == 2 and self.signal_self:
            raise subprocess.TimeoutExpired("study.sweep", timeout)  # the sweep did not get it
        return 130

    def send_signal(self, number: int) -> None:
        self.signals.append(number)


@pytest.mark.parametrize("signal_self", [False, True])
def test_ctrl_c_or_sigterm_waits_for_the_sweep_and_ends_with_one_line(campaign_file: Path, monkeypatch, capsys,
                                                                      signal_self: bool) -> None:
    """Ctrl-C reaches the sweep too, so the driver only waits; SIGTERM reaches the driver alone, so after the grace
    period the sweep is asked to stop with one SIGINT (Tune then saves its state)."""
    sweeps: list[Sweep] = []
    monkeypatch.setattr(runner.subprocess, "Popen", lambda *a, **k: sweeps.append(Sweep(signal_self)) or sweeps[-1])
    before = signal.getsignal(signal.SIGTERM)
    assert main([str(campaign_file), "--datasets", "small", "--studies", "a", "--quick"]) == 130
    [sweep] = sweeps
    assert sweep.signals == ([signal.SIGINT] if signal_self else []) and len(sweep.waits) == 2 + signal_self
    err = capsys.readouterr().err
    assert err.startswith("interrupted; rerun the same command") and "Traceback" not in err
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is this command's only
