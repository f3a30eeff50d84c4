"""The single-trial command, ``python -m study.train``: its flags, the dataset prepared (or a trial's own, to continue
it), one :func:`~study.train.trainer.run_trial`, and one JSON line on stdout. Bad input is one ``error:`` line and exit
code 2; Ctrl-C with no finished epoch, or an interrupted run's row, exit code 130."""

from __future__ import annotations

import argparse
import sys

import models
from models import ConfigError
from study.errors import UserError, print_error
from study.train.config import parse_assignments, read_settings_file, split_settings
from study.train.results import to_json_line
from study.train.state import continuation, load_state
from study.train.trainer import run_trial
from study.train.trial_data import TrialData


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m study.train",
        description="Train and evaluate one model on one dataset, without Ray. Ends with one JSON line on stdout.")
    parser.add_argument("--model", help=f"one of: {', '.join(models.available())} (default sasrec)")
    parser.add_argument("--dataset", help="a recipe name (python -m study.data list; default ml-100k)")
    parser.add_argument("--source", help="local file, folder or zip for the recipe (offline machines)")
    parser.add_argument("--kcore", type=int, help="override the recipe's k-core filter")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                        help="any trainer, protocol or model key, e.g. --set max_epochs=2 --set hidden_size=128")
    parser.add_argument("--config", metavar="FILE",
                        help="a YAML mapping of --set keys (e.g. an exported model's config.yaml); --set wins")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--resume-from", metavar="DIR",
                        help="continue the trial whose training state DIR holds (a sweep trial's checkpoint folder) "
                             "with its model, settings and dataset; --set may change only when it stops, where it "
                             "runs and what it measures, e.g. --set max_epochs=500")
    args = parser.parse_args(argv)
    try:
        from study.data import prepare, prepared_copy

        settings = {**(read_settings_file(args.config) if args.config else {}), **parse_assignments(args.settings)}
        model_name, state = args.model or "sasrec", None
        if args.resume_from:
            state = load_state(args.resume_from)
            model_name, settings, recorded = continuation(state, settings)
            if args.model and args.model != model_name or args.dataset and args.dataset != recorded.get("name"):
                raise UserError(f"{args.resume_from} holds a {model_name} trial on {recorded.get('name')}; "
                                "leave out --model and --dataset")
        _, model_hparams = split_settings(model_name, settings)  # also checks the trainer's keys
        max_len = model_hparams.get("max_len", models.model_class(model_name).config_class.max_len)
        # num_items (and num_users, for models that read them) come from the data: placeholders to validate the rest
        placeholders = {"num_items": 1, "max_len": max_len}
        if models.model_class(model_name).needs_users:
            placeholders["num_users"] = model_hparams.get("num_users", 1)
        models.make_config(model_name, **{**model_hparams, **placeholders})
        if state is None:
            path = prepare(args.dataset or "ml-100k", source=args.source, max_len=max_len, kcore=args.kcore,
                           progress=not args.no_progress)
        else:  # the dataset the trial trained on: its cached copy, or --source prepared again to the same hash
            path = prepared_copy(recorded, max_len, source=args.source, kcore=recorded.get("kcore"),
                                 progress=not args.no_progress)
        result = run_trial(model_name, TrialData.from_prepared(path, max_len), settings,
                           progress=not args.no_progress, resume_from=state)
    except (UserError, ConfigError) as error:
        return print_error(error)
    except FloatingPointError as error:  # NonFiniteLoss / NonFiniteScores: the run diverged, not a bad input
        print(f"error: the trial failed: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: no finished epoch to report", file=sys.stderr)
        return 130
    print(to_json_line(result))
    if result["status"] == "interrupted":
        return 130
    return 0
