"""A study file's configuration crossed with a small grid, each cell trained to its early stop; picked on validation.

    python -m benchmarks.validation_grid experiments/reproduction/studies/bert4rec.yaml --dataset lastfm
        --source PATH/LastFM.txt --grid mask_prob=0.1,0.2,0.4 --grid lr=5e-4,1e-3,2e-3
        [--seeds 1] [--parallel 2] [--device auto] [--label NAME] [--out benchmarks/results/validation_grid.csv]
        [--table-only]

Why: a reproduction study runs each model at one configuration (``fixed`` in its study file). When a model falls
short of a claim, the question is whether another setting of the knobs its paper leaves open would reach it. This
answers it the way a study would: every cell keeps the study file's protocol, ``fixed`` keys and epoch budget, and
changes only the ``--grid`` keys; the best cell is the one with the highest mean *validation* NDCG@10 over the seeds.
Test metrics are kept in the rows but never choose anything.

Each cell is one ``python -m study.train`` process with one thread (``OMP_WAIT_POLICY=PASSIVE``), ``--parallel`` at
a time; a row is appended to the CSV as soon as its run ends, with the load average when it started. A rerun skips
the cells the CSV holds, so an interrupted grid continues. Without Ray: it runs where only torch and the data
libraries are installed, a GPU machine too (``--device cuda``: the runs share the GPU).

``--label`` names the data in the rows in place of the recipe, for a ``--source`` that is a variant of the recipe's
file (say, the file without each user's newest item, which moves validation and test one item back in time): its
rows then stand apart in the table, and a rerun neither skips its cells for the recipe's rows nor theirs for its.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.bert4rec_budget import read_rows
from models import config_fields, recorded_config
from study.spec.yaml_io import read_yaml
from study.train.config import split_settings
from study.train.objectives import resolve_cloze_window_step

DEFAULT_OUT = Path("benchmarks/results/validation_grid.csv")
# the columns every row has; each grid key gets its own column after them. ``settings`` is the run's whole
# configuration (the study's keys with the grid's values), which is what makes two rows the same cell
COLUMNS = ("study", "model", "dataset", "seed", "valid_ndcg@10", "test_ndcg@10", "test_hr@10", "pop_ndcg@10",
           "best_epoch", "epochs_run", "epoch_time_s", "wall_time_s", "device", "load_at_start", "settings")
# where a run happens, not what it trains: left out of ``settings``
PLACEMENT_KEYS = ("device", "num_threads", "seed")
# trainer keys added after rows of the CSV were written, each with the value those rows ran as, so that a row from
# before a key existed and one from after it are the same cell when they trained the same way (a model's own such
# keys are its config's ADDED_AFTER, read through models.recorded_config)
INTRODUCED_KEYS = {"compile_mode": "default",  # before it, no step replayed CUDA graphs
                   "cloze_window_step": "0"}   # before it, cloze trained on each user's newest window only


def parse_grid(items: list[str]) -> dict[str, list[str]]:
    """``["lr=1e-3,2e-3", "mask_prob=0.2"]`` -> ``{"lr": ["1e-3", "2e-3"], "mask_prob": ["0.2"]}``."""
    grid: dict[str, list[str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        picked = [value.strip() for value in values.split(",") if value.strip()]
        if not sep or not key or not picked:
            raise ValueError(f"--grid wants KEY=V1,V2,..., got {item!r}")
        grid[key] = picked
    return grid


def canonical(value: object) -> str:
    """One spelling per value, so that ``1e-3``, ``0.001`` and YAML's ``1.0e-3`` name the same cell."""
    text = str(value).strip()
    if text.lower() in ("true", "false"):
        return text.lower()
    try:
        number = float(text)
    except ValueError:
        return text
    return str(int(number)) if number.is_integer() and "." not in text and "e" not in text.lower() else repr(number)


def study_settings(study_file: Path) -> tuple[str, str, str, dict[str, str]]:
    """The study's file name, model, dataset recipe and the ``--set`` keys of ``python -m study.train`` that fix
    its configuration: its protocol, its ``fixed`` keys and its epoch budget (``search`` is the grid's job)."""
    data, _ = read_yaml(study_file)
    settings = {**data.get("protocol", {}), **data.get("fixed", {})}
    if "max_epochs" in data.get("budget", {}):
        settings["max_epochs"] = data["budget"]["max_epochs"]
    return study_file.stem, data["model"], data["dataset"]["name"], {key: canonical(v) for key, v in settings.items()}


def settings_text(model: str, cell: dict[str, str]) -> str:
    """The run's whole configuration, every trainer and model key with its default filled in, as ``k=v;k=v``:
    two cells are the same run exactly when these are equal, however their keys were spelled or given."""
    train, model_values = split_settings(model, {key: value for key, value in cell.items()
                                                 if key not in PLACEMENT_KEYS})
    defaults = {}
    for name, field in config_fields(model).items():
        if field.default is not dataclasses.MISSING:
            defaults[name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            defaults[name] = field.default_factory()
    config = {**defaults, **model_values, **dataclasses.asdict(train)}
    return same_cell(";".join(f"{key}={canonical(config[key])}" for key in sorted(config)
                              if key not in (*PLACEMENT_KEYS, "num_items")), model)


def same_cell(text: str, model: str) -> str:
    """A row's ``settings`` in today's spelling: a key the trainer or the row's model gained after the row was
    written gets the value the row ran as (``INTRODUCED_KEYS``, ``models.recorded_config``), and
    ``cloze_window_step`` is the step the run used (0 for an objective without cloze windows, 0.1 x max_len for the
    cloze default), not how it was asked for."""
    recorded = {**INTRODUCED_KEYS, **_parse_settings(text)}
    settings = {key: canonical(value) for key, value in recorded_config(model, recorded).items()}
    step = settings["cloze_window_step"]
    settings["cloze_window_step"] = str(resolve_cloze_window_step(
        settings.get("objective", ""), None if step == "None" else int(step), int(settings.get("max_len", 0)), model))
    return ";".join(f"{key}={settings[key]}" for key in sorted(settings))


def cells(base: dict[str, str], grid: dict[str, list[str]], seeds: list[int]) -> list[dict[str, str]]:
    """Every grid point over ``base`` once per seed, seed-major, so an interrupted grid holds whole seeds."""
    points = [dict(zip(grid, map(canonical, values))) for values in itertools.product(*grid.values())]
    return [{**base, **point, "seed": str(seed)} for seed in seeds for point in points]


def run_cell(argv: list[str], cell: dict[str, str], row_base: dict[str, str], out: Path, fields: list[str],
             shown: list[str], lock: threading.Lock) -> None:
    """Train one cell in its own process and append its row to ``out``; ``shown``: the keys its progress line
    names (the grid's)."""
    load = os.getloadavg()[0]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE",
           "PYTHONPATH": os.environ.get("PYTHONPATH", os.getcwd())}
    full = argv + [arg for key, value in cell.items() for arg in ("--set", f"{key}={value}")]
    done = subprocess.run(full, capture_output=True, text=True, env=env)
    label = " ".join(f"{key}={cell[key]}" for key in (*shown, "seed"))
    if done.returncode != 0:
        print(f"{label}: failed ({done.returncode}): {done.stderr.strip()[-500:]}", file=sys.stderr, flush=True)
        return
    result = json.loads(done.stdout.strip().splitlines()[-1])
    row = {**row_base, **cell, "model": result["model"], "device": result["device"], "load_at_start": f"{load:.1f}",
           **{key: f"{result[key]:.5f}" for key in ("valid_ndcg@10", "test_ndcg@10", "test_hr@10", "pop_ndcg@10")},
           "best_epoch": result["best_epoch"], "epochs_run": result["epochs_run"],
           "epoch_time_s": f"{result['epoch_time_s']:.2f}", "wall_time_s": f"{result['wall_time_s']:.0f}",
           "settings": settings_text(result["model"], cell)}
    with lock:
        new_file = not out.exists()
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=fields, extrasaction="ignore")
            if new_file:
                writer.writeheader()
            writer.writerow(row)
    print(f"{label}: valid ndcg@10 {row['valid_ndcg@10']}, best epoch {row['best_epoch']} of {row['epochs_run']}, "
          f"{row['wall_time_s']} s", flush=True)


def _parse_settings(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split(";") if part)


def table(rows: list[dict]) -> str:
    """Mean ± sd over seeds per cell, best validation first within each (study, dataset), whose best cell is
    starred. The columns name the settings that differ between that pair's cells."""
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["study"], row["dataset"], same_cell(row["settings"], row["model"])), []).append(row)

    def spread(picked: list[dict], column: str, digits: int = 4) -> tuple[float, str]:
        values = [float(row[column]) for row in picked]
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        return statistics.mean(values), f"{statistics.mean(values):.{digits}f} ± {sd:.{digits}f}"

    lines = []
    for pair in sorted({key[:2] for key in groups}):
        cells_of_pair = {key[2]: picked for key, picked in groups.items() if key[:2] == pair}
        parsed = {text: _parse_settings(text) for text in cells_of_pair}
        names = sorted({name for settings in parsed.values() for name in settings})
        varying = [name for name in names if len({settings.get(name, "") for settings in parsed.values()}) > 1]
        header = ["study", "dataset", *varying, "seeds", "valid NDCG@10", "test NDCG@10", "best epoch",
                  "epochs run"]
        lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        ordered = sorted(cells_of_pair.items(), key=lambda item: -spread(item[1], "valid_ndcg@10")[0])
        for rank, (text, picked) in enumerate(ordered):
            lines.append("| " + " | ".join([*pair, *(parsed[text].get(name, "") for name in varying),
                                             str(len(picked)),
                                             spread(picked, "valid_ndcg@10")[1] + (" *" if rank == 0 else ""),
                                             spread(picked, "test_ndcg@10")[1], spread(picked, "best_epoch", 0)[1],
                                             spread(picked, "epochs_run", 0)[1]]) + " |")
    return "\n".join(lines[1:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.validation_grid", description=__doc__.split("\n")[0])
    parser.add_argument("study_file", type=Path, nargs="?",
                        help="a study YAML, e.g. experiments/reproduction/studies/bert4rec.yaml (not for --table-only)")
    parser.add_argument("--dataset", default=None, help="a data recipe (default: the study file's)")
    parser.add_argument("--source", default=None, help="the recipe's local file (offline machines)")
    parser.add_argument("--label", default=None,
                        help="the data's name in the rows (default: the recipe's), for a --source that is a variant "
                             "of the recipe's file")
    parser.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                        help="a study.train key and its values; repeat for a product")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time, one thread each")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--table-only", action="store_true")
    args = parser.parse_args(argv)
    try:
        grid = parse_grid(args.grid)
    except ValueError as error:
        parser.error(str(error))
    if not args.table_only:
        if args.study_file is None or not grid:
            parser.error("give a study file and at least one --grid KEY=V1,V2")
        fixed_by_study = {"objective", "eval_mode", "mask_history", "max_epochs", "patience", *PLACEMENT_KEYS}
        clash = sorted(set(grid) & fixed_by_study)
        if clash:
            parser.error(f"--grid may not change the study's protocol, budget or placement: {', '.join(clash)}")
        study, model, recipe, settings = study_settings(args.study_file)
        dataset = args.dataset or recipe
        if args.label is not None and not args.source:
            parser.error("--label names a variant of the recipe's file: give that file with --source")
        label = args.label or dataset
        base = [sys.executable, "-m", "study.train", "--model", model, "--dataset", dataset, "--no-progress",
                "--set", f"device={args.device}", "--set", "num_threads=1"]
        if args.source:
            base += ["--source", args.source]
        previous = read_rows(args.out)
        done = {(same_cell(row["settings"], row["model"]), row["seed"]) for row in previous
                if (row["study"], row["dataset"]) == (study, label)}
        todo = [cell for cell in cells(settings, grid, args.seeds)
                if (settings_text(model, cell), cell["seed"]) not in done]
        existing = list(previous[0]) if previous else []
        fields = existing + [key for key in (*COLUMNS, *grid) if key not in existing]
        if existing and fields != existing:  # a new grid key: rewrite the CSV under the wider header
            with args.out.open("w", newline="") as file:
                writer = csv.DictWriter(file, fieldnames=fields)
                writer.writeheader()
                writer.writerows(previous)
        print(f"{study} on {label}: {len(todo)} runs to do ({' × '.join(grid)}, seeds {args.seeds})", flush=True)
        lock = threading.Lock()
        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            for future in [pool.submit(run_cell, base, cell, {"study": study, "dataset": label}, args.out, fields,
                                       list(grid), lock) for cell in todo]:
                future.result()
    print(table(read_rows(args.out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
