"""The generated part of a campaign's page: per dataset, the paper-style table, one line per claim and per published
row, the ablation tables and the runs stopped by the epoch limit.

Choices:

- A table gives mean ± sd over the seeds (sample sd), the mean best epoch with the mean epochs run, and the median
  seconds per epoch. The verdicts follow :mod:`study.analysis.claims`.
- A run "stopped by the epoch limit" is one whose best epoch was its last (still improving), or one stopped fewer
  epochs after its best than its patience (its stopping rule had not fired yet). Each run's own ``max_epochs`` and
  ``patience`` count where its row records them, else the campaign's ``epoch_limit`` and patience 10.
- Only the part between the ``generated`` markers is rewritten; the hand-written reading around it is kept.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd

from study.analysis.runs import HISTORY_FILE, assign_labels, collect_runs, load_results
from study.analysis.tables import short
from study.analysis.verdicts import claim_lines, mean_sd, published_lines
from study.campaign.spec import Campaign
from study.spec.yaml_io import read_yaml

BEGIN, END = "<!-- generated: python -m study.campaign -->", "<!-- end of generated part -->"
DEFAULT_PATIENCE = 10  # the trainer's default, for rows that do not record theirs
PARETO_AXES = ("peak_mem_mb", "infer_ms_p50")


def seed_values(folders: dict[str, Path]) -> dict[str, pd.DataFrame]:
    """Per study: its successful runs, one row per seed."""
    studies = [load_results(folder) for folder in folders.values()]
    assign_labels(studies)
    runs = collect_runs(studies)
    runs = runs[runs["measured"]]
    return {key: runs[runs["study"] == folder.name].drop_duplicates("seed").set_index("seed")
            for key, folder in folders.items()}


def trial_wall_s(runs: pd.DataFrame, folder: Path) -> float:
    """Wall time of a study's runs: per run, its row's figure or, where larger, its last epoch's cumulative time.

    Older rows count only the last run of a trial stopped and resumed; the epoch reports always counted the earlier
    runs too (the checkpoint carries their time), so the larger of the two is the trial's.
    """
    history_file = folder / HISTORY_FILE
    if not len(runs) or not history_file.is_file():
        return float(runs["wall_time_s"].sum()) if len(runs) else 0.0
    history = pd.read_parquet(history_file, columns=["trial_id", "epoch", "wall_time_s"])
    trained = history.sort_values("epoch").groupby("trial_id")["wall_time_s"].last()
    epochs = trained.reindex(runs["trial_id"]).to_numpy()
    return float(pd.Series(runs["wall_time_s"].to_numpy()).combine(pd.Series(epochs), max).sum())


def with_sampled(values: dict[str, pd.DataFrame], metrics: tuple[str, ...]) -> tuple[str, ...]:
    """``metrics`` and, after them, their sampled counterparts (``test_sampled_…``) that some study of ``values``
    recorded: a table that holds a study with sampled test metrics shows them beside the full ranking's."""
    sampled = [f"test_sampled_{m.removeprefix('test_')}" for m in metrics if m.startswith("test_")]
    return (*metrics, *(m for m in sampled if any(m in runs and runs[m].notna().any() for runs in values.values())))


def results_table(values: dict[str, pd.DataFrame], metrics: tuple[str, ...]) -> list[str]:
    """One row per study: the means ± sd of ``metrics`` (and of their sampled counterparts, where recorded), the
    mean best and last epochs, and the median seconds an epoch."""
    metrics = with_sampled(values, metrics)
    names = " | ".join(short(m) for m in metrics)
    lines = [f"| study | objective | seeds | {names} | best epoch (of run) | s/epoch |",
             "|---|---|---|" + "---|" * len(metrics) + "---|---|"]
    for study, runs in values.items():
        objective = str(runs["objective"].iloc[0]) if "objective" in runs and len(runs) else "–"
        epochs = f"{runs['best_epoch'].mean():.0f} ({runs['epochs_run'].mean():.0f})" if len(runs) else "–"
        seconds = f"{runs['epoch_time_s'].median():.1f}" if "epoch_time_s" in runs and len(runs) else "–"
        lines.append(f"| {study} | {objective} | {len(runs)} | "
                     + " | ".join(mean_sd(runs[m]) if m in runs else "–" for m in metrics)
                     + f" | {epochs} | {seconds} |")
    return lines


def unconverged(values: dict[str, pd.DataFrame], max_epochs: int, patience: int = DEFAULT_PATIENCE) -> list[str]:
    """The runs the epoch limit stopped, not their early stop (see the module's choices), one line each."""
    lines = []
    for study, runs in values.items():
        limit, wait = (runs[key].fillna(default) if key in runs else pd.Series(default, index=runs.index)
                       for key, default in (("config.max_epochs", max_epochs), ("config.patience", patience)))
        since_best = runs["epochs_run"] - runs["best_epoch"]
        at_limit = runs["epochs_run"] >= limit
        improving = runs[at_limit & (since_best == 0)]
        if len(improving):
            epochs = sorted({int(e) for e in improving["epochs_run"]})
            lines.append(f"- {study}: seeds {', '.join(str(int(s)) for s in improving.index)} were still improving "
                         f"at epoch {', '.join(map(str, epochs))}")
        for seed in sorted(runs.index[at_limit & (since_best > 0) & (since_best < wait)]):
            lines.append(f"- {study}: seed {int(seed)} stopped at epoch {int(runs.at[seed, 'epochs_run'])}, "
                         f"{int(since_best[seed])} epochs after its best, before its patience of "
                         f"{int(wait[seed])} ran out")
    return lines


def published_section(campaign: Campaign, dataset: str, folders: dict[str, Path], epoch_limit: int) -> list[str]:
    """The studies rerun under a published table's protocol, against that table's rows."""
    values = seed_values(folders)
    stopped = unconverged(values, epoch_limit)
    return ["### Against published rows", "", *results_table(values, campaign.metrics), "",
            *published_lines(dataset, values, campaign.claims), "",
            *(stopped and ["Stopped by the epoch limit:", "", *stopped, ""])]


def dataset_section(campaign: Campaign, dataset: str, folders: dict[str, Path], epoch_limit: int,
                    report_dir: Path, page: Path) -> list[str]:
    """A dataset's tables, its claims, its ablation tables and the runs stopped by the epoch limit."""
    values = seed_values(folders)
    main = {k: v for k, v in values.items() if k not in campaign.ablation_studies}
    wall = sum(trial_wall_s(values[study], folder) for study, folder in folders.items())
    link = report_dir.relative_to(page.parent)
    lines = [*results_table(main, campaign.metrics), "",
             f"Full report with the paired t-tests (Holm), effect sizes and the Pareto fronts: "
             f"[{report_dir.name}/report.md]({link}/report.md). "
             f"Training time of these runs: {wall / 3600:.2f} h of trial wall time.", "",
             *(f"![Pareto front of validation NDCG@10 against {axis}, {dataset}]"
               f"({link}/pareto_valid_ndcg_10__{axis}.png)" for axis in PARETO_AXES), "",
             "### Claims", "", *(claim_lines(values, campaign.claims) or ["- no claim has both of its studies yet"]),
             *unrun_claim_lines(campaign, dataset, values), ""]
    for model, group in campaign.ablations.items():
        ablations = {study: values[study] for study in group if study in values}
        if any(study in campaign.ablation_studies for study in ablations):
            lines += [f"### {model} ablations", "", *results_table(ablations, campaign.metrics), ""]
    stopped = unconverged(values, epoch_limit)
    lines += ["### Runs stopped by the epoch limit", "",
              *(stopped or ["- none: every run stopped early on validation"]), ""]
    return lines


def unrun_claim_lines(campaign: Campaign, dataset: str, values: dict[str, pd.DataFrame]) -> list[str]:
    """One line per study claim of ``dataset`` that waits for a study without records: what it needs, and that the
    campaign command runs it (a claim is never dropped from the page without a word)."""
    planned = set(campaign.datasets[dataset].studies)
    lines = []
    for claim in campaign.claims:
        studies = (claim.candidate, claim.reference)
        missing = [study for study in studies if study not in values]
        if claim.against_published or not missing or not set(studies) <= planned:
            continue
        role = f" ({claim.role})" if claim.role else ""
        lines.append(f"- **not run yet**{role}: {claim.text} ({claim.source}). No records of "
                     f"{' and '.join(missing)} on {dataset}: `python -m study.campaign {campaign.source.name}` runs "
                     "them.")
    return lines


def report_label(campaign: Campaign, folders: dict[str, Path]) -> str:
    """How ``study.report`` names the reference study: ``model@study`` when another study runs the same model."""
    model = read_yaml(campaign.study_file(campaign.reference))[0].get("model", campaign.reference)
    same = [s for s in folders if read_yaml(campaign.study_file(s))[0].get("model") == model]
    return f"{model}@{folders[campaign.reference].name}" if len(same) > 1 else str(model)


def report(campaign: Campaign, dataset: str, folders: dict[str, Path], epoch_limit: int, page: Path,
           reports: Path) -> list[str]:
    """Run ``study.report`` over a dataset's compared studies into ``reports/<dataset>/``; the dataset's section."""
    report_dir = reports / dataset
    command = [sys.executable, "-m", "study.report", *map(str, folders.values()), "--out", str(report_dir),
               "--metrics", ",".join(campaign.metrics), "--reference", report_label(campaign, folders)]
    if subprocess.run(command, stdout=subprocess.DEVNULL).returncode != 0:
        print(f"{dataset}: study.report failed", file=sys.stderr)
    return dataset_section(campaign, dataset, folders, epoch_limit, report_dir, page)


def write_page(sections: list[str], out: Path, title: str) -> None:
    """Replace the generated part of ``out`` (or create it), keeping every hand-written line outside the markers."""
    generated = "\n".join([BEGIN, *sections, END])
    if out.is_file():
        text = out.read_text()
        pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
        text = pattern.sub(lambda _: generated, text) if pattern.search(text) else f"{text.rstrip()}\n\n{generated}\n"
    else:
        text = f"# {title}\n\n{generated}\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
