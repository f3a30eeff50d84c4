"""The sweep YAML: validation before Ray starts (every problem at once, each naming its key and line), --set, and
the shipped search spaces. No Ray here: these tests run in seconds."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

import models
from study.spec.study_file import load_study
from study.spec.yaml_io import StudyConfigError
from study.sweep import main

REPO = Path(__file__).resolve().parents[3]
LASTFM = Path(__file__).resolve().parents[4] / "shared" / "datasets" / "s3rec" / "LastFM.txt"


def write(tmp_path: Path, text: str, name: str = "study.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def errors_of(capsys: pytest.CaptureFixture, argv: list[str]) -> list[str]:
    assert main(argv) == 2
    # the command's first line says what it is doing (before a run's heavy imports); the rest are the error lines
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("study.sweep: ")]
    assert err and all(line.startswith("error: ") for line in err), err
    assert not any("Traceback" in line for line in err)
    return err


@pytest.fixture(autouse=True)
def private_cache(data_cache: Path) -> Path:
    return data_cache


def test_shipped_search_spaces_validate(capsys: pytest.CaptureFixture) -> None:
    assert main([str(REPO / "search_spaces" / "sasrec.yaml"), "--dry-run"]) == 0
    out, err = capsys.readouterr()
    resolved = out
    assert "name: sasrec-ml100k" in resolved and "num_samples: 6" in resolved
    assert re.search(r"checked every \d+ search combination", err)
    # the paper study is sized for a GPU workstation; on this machine it validates once resources fit
    paper = str(REPO / "search_spaces" / "paper" / "sasrec-ml1m.yaml")
    assert main([paper, "--dry-run", "--set", "resources.gpu=0", "--set", "resources.cpu=1"]) == 0
    assert "name: sasrec-ml1m" in capsys.readouterr().out


def test_every_problem_is_reported_with_its_key_and_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = write(tmp_path, f"""
        name: bad-study
        model: sasrec
        dataset: {{name: lastfm, source: {LASTFM}}}
        fixed:
          hidden_size: 32
          max_len: twenty
          bogus_key: 1
        search:
          num_heads: {{choice: [2, 3]}}
          lr: {{loguniform: [1.0e-4, 1.0e-2]}}
          hidden_size: {{choice: [16, 32]}}
          eval_mode: {{choice: [full, sampled]}}
        objectives: {{valid_ndcg@10: max, test_ndcg@10: max}}
        budget: {{num_samples: two}}
        resourcez: {{cpu: 1}}
        """)
    err = errors_of(capsys, [str(path), "--dry-run"])
    text = "\n".join(err)
    expected = [
        (7, "fixed.bogus_key", "unknown key for model sasrec"),
        (11, "search.hidden_size", "also set under fixed"),
        (12, "search.eval_mode", "protocol keys cannot be searched"),
        (13, "objectives.test_ndcg@10", "never used for selection"),
        (14, "budget.num_samples", "expected int, got str 'two'"),
        (15, "resourcez", "unknown section"),
        (6, "fixed.max_len", "expected int"),  # wrong type of a model key, from split_settings
        (9, "search.num_heads", "must divide hidden_size=32, got 3"),  # an impossible combination
    ]
    for line, key, message in expected:
        assert any(f"{path}:{line}: {key}: " in e and message in e for e in err), (line, key, text)
    assert len(err) == len(expected), text


def test_impossible_combination_names_the_search_point(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = write(tmp_path, f"""
        name: heads
        model: sasrec
        dataset: {{name: lastfm, source: {LASTFM}}}
        search:
          hidden_size: {{choice: [32, 48]}}
          num_heads: {{grid: [2, 4]}}
        """)
    err = errors_of(capsys, [str(path), "--dry-run"])
    assert len(err) == 1  # every combination is feasible (32 and 48 split into 2 or 4 heads): only the mix is wrong
    assert "search: grid cannot be combined with sampled keys (hidden_size)" in err[0]
    path = write(tmp_path, f"""
        name: heads
        model: sasrec
        dataset: {{name: lastfm, source: {LASTFM}}}
        search:
          hidden_size: {{grid: [30, 32]}}
          num_heads: {{grid: [1, 4]}}
        """)
    err = errors_of(capsys, [str(path), "--dry-run"])
    assert err == [f"error: {path}:6: search.num_heads: must divide hidden_size=30, got 4 "
                   "(at search point hidden_size=30, num_heads=4)"]


@pytest.mark.skipif("elastic" not in models.available(), reason="ELASTIC is not registered yet")
def test_model_declared_constraints_are_checked_over_the_product(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = write(tmp_path, f"""
        name: elastic-bad
        model: elastic
        dataset: {{name: lastfm, source: {LASTFM}}}
        search:
          num_experts: {{choice: [16, 20]}}
          top_k: {{choice: [2, 5]}}
        """)
    err = errors_of(capsys, [str(path), "--dry-run"])
    assert any(":5: search.num_experts: must be a perfect square" in e and "num_experts=20" in e for e in err), err
    assert any(":6: search.top_k: must be <= sqrt(num_experts)=4" in e and "top_k=5" in e for e in err), err


def test_malformed_yaml_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = write(tmp_path, """
        name: broken
        model: sasrec
        search:
          lr: {loguniform: [1.0e-4, 1.0e-2]
        budget: {num_samples: 2}
        """)
    err = errors_of(capsys, [str(path), "--dry-run"])
    assert len(err) == 1 and re.match(rf"error: {re.escape(str(path))}:\d+:\d+: malformed YAML", err[0]), err
    line = int(err[0].split(":")[2])
    assert line in (4, 5), err  # the unclosed flow mapping opened on line 4 is reported where the parser noticed
    path = write(tmp_path, "name: twice\nmodel: sasrec\nname: again\n")
    assert errors_of(capsys, [str(path), "--dry-run"]) == [f"error: {path}:3: name: given twice"]


def test_set_overrides_dotted_paths(tmp_path: Path) -> None:
    path = write(tmp_path, f"""
        name: overrides
        model: sasrec
        dataset: {{name: lastfm, source: {LASTFM}}}
        search:
          lr: {{loguniform: [1.0e-4, 1.0e-2]}}
        budget: {{num_samples: 6, max_epochs: 10}}
        """)
    study = load_study(path, ["budget.num_samples=2", "fixed.max_epochs=3", "search.lr={choice: [1e-3, 0.01]}",
                              "seeds.train=7", "fixed.hidden_size=32"])
    assert study.budget.num_samples == 2
    assert study.budget.max_epochs == 3  # the command line wins over the file's budget.max_epochs
    assert study.search["lr"].kind == "choice" and study.search["lr"].values == [0.001, 0.01]  # 1e-3 read as a number
    assert study.settings({"lr": 0.01}) == {"hidden_size": 32, "max_epochs": 3, "seed": 7, "lr": 0.01}
    with pytest.raises(StudyConfigError) as caught:
        load_study(path, ["fixed.bogus=1", "budget.num_samples=-1", "nosep"])
    assert caught.value.errors == ["--set nosep: expected section.key=value, e.g. budget.num_samples=2"]
    with pytest.raises(StudyConfigError) as caught:
        load_study(path, ["fixed.bogus=1", "budget.num_samples=-1"])
    assert any(e.startswith("--set fixed.bogus: unknown key") for e in caught.value.errors), caught.value.errors
    assert any(e.startswith("--set budget.num_samples: must be >= 1") for e in caught.value.errors)


def test_cross_section_combinations(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = write(tmp_path, f"""
        name: combos
        model: sasrec
        dataset: {{name: lastfm, source: {LASTFM}}}
        fixed: {{measure_efficiency: false, num_threads: 4}}
        search:
          lr: {{grid: [0.001, 0.01]}}
        objectives: {{valid_ndcg@10: max, peak_mem_mb: min, bogus_metric: max}}
        budget: {{num_samples: 2, max_epochs: 2}}
        scheduler: {{metric: peak_mem_mb, grace_period: 0}}
        resources: {{cpu: 1, gpu: -1, workers_per_trial: 0}}
        """)
    text = "\n".join(errors_of(capsys, [str(path), "--dry-run"]))
    for fragment in ["objectives.bogus_metric: unknown objective",
                     "objectives.peak_mem_mb: needs measure_efficiency: true",
                     "scheduler.metric: ASHA stops trials on a validation metric",
                     "scheduler.grace_period: must be >= 1 epoch, got 0",
                     "resources.gpu: must be >= 0", "resources.workers_per_trial: must be >= 1",
                     "fixed.num_threads: 4 threads on resources.cpu=1 oversubscribes"]:
        assert fragment in text, (fragment, text)


def test_missing_dataset_names_the_recipe_and_how_to_provide_it(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = write(tmp_path, """
        name: no-source
        model: sasrec
        dataset: {name: lastfm}
        search: {lr: {choice: [0.001]}}
        """)
    err = errors_of(capsys, [str(path), "--dry-run"])
    assert len(err) == 1 and "dataset.source: dataset 'lastfm' cannot be downloaded" in err[0]
    assert "--set dataset.source=PATH" in err[0]
    # a source the recipe cannot read fails when the run prepares the data, before Ray starts, naming the recipe
    (tmp_path / "LastFM.txt").write_text("")
    err = errors_of(capsys, [str(path), "--set", f"dataset.source={tmp_path / 'LastFM.txt'}",
                             "--set", f"storage={tmp_path / 'out'}"])
    assert len(err) == 1 and f"{path}: dataset 'lastfm': " in err[0], err
    assert not (tmp_path / "out" / "tune").exists()


def test_help_documents_the_schema(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for section in ("objectives:", "budget:", "scheduler:", "resources:", "searcher:", "n_startup_trials", "seeds:",
                    "loguniform", "grid", "--set", "budget.max_epochs=1",
                    "--dry-run", "--resume", "--dashboard"):
        assert section in out, section


def press_ctrl_c(*args: object, **kwargs: object) -> None:
    """A sweep's run, stopped by Ctrl-C."""
    raise KeyboardInterrupt


def test_ctrl_c_names_the_resume_command_with_the_overrides_that_locate_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """A study renamed or moved with --set is found again only if --resume repeats those --set: the hint must."""
    import shlex

    from study.sweep import build_parser

    monkeypatch.setattr("study.search.runner.run_study", press_ctrl_c)
    overrides = ["name=renamed-run", f"storage={tmp_path / 'my results' / 'renamed-run'}"]
    argv = [str(REPO / "search_spaces" / "sasrec.yaml"), *(w for o in overrides for w in ("--set", o)),
            "--num-cpus", "1"]
    assert main(argv) == 130
    hint = capsys.readouterr().err.strip().splitlines()[-1]
    assert hint.startswith("interrupted; continue with: python -m study.sweep ")
    again = build_parser().parse_args(shlex.split(hint.split("python -m study.sweep ", 1)[1]))
    assert again.study == argv[0] and again.overrides == overrides and again.num_cpus == 1 and again.resume


def test_a_sweep_started_by_a_campaign_leaves_the_resume_line_to_the_campaign(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """Two lines saying how to continue, the sweep's and the campaign's, would compete: --no-resume-line drops the
    sweep's and keeps the exit code the campaign reads."""
    monkeypatch.setattr("study.search.runner.run_study", press_ctrl_c)
    assert main([str(REPO / "search_spaces" / "sasrec.yaml"), "--num-cpus", "1", "--no-resume-line"]) == 130
    err = capsys.readouterr().err
    assert "interrupted" not in err and "--resume" not in err


def windows_study(tmp_path: Path, model: str, resources: str = "{cpu: 1}", fixed: str = "{window_step: 5}",
                  name: str = "", protocol: str = "{}") -> Path:
    """A one-point study on LastFM that trains ``model`` on windows over the whole history, 5 items apart."""
    return write(tmp_path, f"""
        name: windows-{model}
        model: {model}
        dataset: {{name: lastfm, source: {LASTFM}}}
        protocol: {protocol}
        fixed: {fixed}
        search: {{lr: {{grid: [0.001]}}}}
        budget: {{num_samples: 1, max_epochs: 2}}
        resources: {resources}
        """, name=f"{name or model}.yaml")


def test_window_settings_need_windows_to_cut_and_whole_histories(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    [error] = errors_of(capsys, [str(windows_study(tmp_path, "sasrec", protocol="{objective: last}")), "--dry-run"])
    assert "fixed.window_step: `last` trains on every prefix of the whole history" in error and "'last'" in error
    sharded = windows_study(tmp_path, "bert4rec", "{cpu: 1, workers_per_trial: 2}")
    text = "\n".join(errors_of(capsys, [str(sharded), "--dry-run"]))
    assert "fixed.window_step: window_step 5 cuts every user's whole history into windows" in text
    assert "set window_step: 0" in text
    renamed = windows_study(tmp_path, "bert4rec", fixed="{cloze_window_step: 5}", name="renamed")
    assert "fixed.cloze_window_step: unknown key for model bert4rec; renamed to window_step" in "\n".join(
        errors_of(capsys, [str(renamed), "--dry-run"]))


def test_data_parallel_trials_train_on_the_newest_windows_by_default(tmp_path: Path) -> None:
    from study.search.runner import _base_settings

    sharded = "{cpu: 1, workers_per_trial: 2}"
    for model in ("bert4rec", "sasrec"):  # cloze and causal: a worker's shard holds no whole histories
        default = windows_study(tmp_path, model, sharded, fixed="{}", name=f"default-{model}")
        assert main([str(default), "--dry-run"]) == 0
        assert _base_settings(load_study(default))["window_step"] == 0
    alone = load_study(windows_study(tmp_path, "sasrec", fixed="{}", name="alone"))
    assert "window_step" not in _base_settings(alone)  # `auto`: the objective's default


def test_a_searched_window_step_is_checked_at_each_value(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    searched = write(tmp_path, f"""
        name: windows-searched
        model: sasrec
        dataset: {{name: lastfm, source: {LASTFM}}}
        fixed: {{max_len: 50}}
        search: {{window_step: {{grid: [0, 60]}}}}
        budget: {{num_samples: 2, max_epochs: 2}}
        """)
    [error] = errors_of(capsys, [str(searched), "--dry-run"])
    assert "window_step: 60 is longer than the window (max_len 50)" in error
    assert "at search point window_step=60" in error


def test_cuda_graph_modes_are_refused_before_any_trial_unless_the_objective_is_last(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    def study(objective: str) -> Path:
        return write(tmp_path, f"""
            name: graphs-{objective}
            model: sasrec
            dataset: {{name: lastfm, source: {LASTFM}}}
            protocol: {{objective: {objective}}}
            fixed: {{compile: true, compile_mode: reduce-overhead}}
            search: {{lr: {{grid: [0.001]}}}}
            budget: {{num_samples: 1, max_epochs: 2}}
            """, name=f"{objective}.yaml")

    [error] = errors_of(capsys, [str(study("causal")), "--dry-run"])
    assert "causal.yaml:5: fixed.compile_mode: 'reduce-overhead' replays CUDA graphs, which only the `last`" in error
    assert "'causal' scores a batch-dependent number of positions" in error
    assert main([str(study("last")), "--dry-run"]) == 0


def _energy_study(tmp_path: Path, objectives: str, fixed: str = "{max_len: 20}", resources: str = "{cpu: 1}") -> Path:
    return write(tmp_path, f"""
        name: energy
        model: sasrec
        dataset: {{name: lastfm, source: {LASTFM}}}
        fixed: {fixed}
        search: {{lr: {{grid: [0.001]}}}}
        objectives: {objectives}
        budget: {{num_samples: 1, max_epochs: 2}}
        resources: {resources}
        """)


def test_an_energy_objective_is_refused_where_no_counter_measures_it(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Before Ray starts, with the reason; on a joined cluster (no machine check) the nodes' counters decide."""
    from study.spec.checks import energy_line
    from study.train import energy

    monkeypatch.setattr(energy, "POWERCAP", tmp_path / "no-powercap")
    path = _energy_study(tmp_path, "{valid_ndcg@10: max, train_energy_j_per_epoch: min}")
    [error] = errors_of(capsys, [str(path), "--dry-run"])
    assert "objectives.train_energy_j_per_epoch: energy is not measured on this machine: no RAPL package domain" \
        in error
    assert load_study(path, check_machine=False).objectives["train_energy_j_per_epoch"] == "min"
    # without an energy objective the study runs, and the sweep says once that energy is not measured
    line = energy_line(load_study(_energy_study(tmp_path, "{valid_ndcg@10: max}")), concurrency=2)
    assert line.startswith("energy: not measured on this machine (no RAPL package domain under ")


def test_an_energy_objective_runs_where_a_counter_measures_it(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from study.spec.checks import energy_line
    from study.train import energy

    package = tmp_path / "powercap" / "intel-rapl:0"
    package.mkdir(parents=True)
    for name, value in (("name", "package-0"), ("energy_uj", "1000"), ("max_energy_range_uj", "262143328850")):
        (package / name).write_text(value + "\n")
    monkeypatch.setattr(energy, "POWERCAP", tmp_path / "powercap")
    study = load_study(_energy_study(tmp_path, "{valid_ndcg@10: max, train_energy_j_per_epoch: min, "
                                               "infer_energy_j_per_1k: min}"))
    assert list(study.objectives) == ["valid_ndcg@10", "train_energy_j_per_epoch", "infer_energy_j_per_1k"]
    assert energy_line(study, concurrency=1) is None
    assert "which 2 trials at a time share" in energy_line(study, concurrency=2)

    unmeasured = _energy_study(tmp_path, "{infer_energy_j_per_1k: min}", fixed="{measure_efficiency: false}")
    [error] = errors_of(capsys, [str(unmeasured), "--dry-run"])
    assert "objectives.infer_energy_j_per_1k: needs measure_efficiency: true" in error
    parallel = _energy_study(tmp_path, "{train_energy_j_per_epoch: min}", resources="{cpu: 1, workers_per_trial: 2}")
    [error] = errors_of(capsys, [str(parallel), "--dry-run"])
    assert "data-parallel trials (workers_per_trial > 1) record no training energy" in error
