"""The one trainer: fit a registry model on a prepared dataset, evaluate, and record one result row.

    python -m study.train --model sasrec --dataset ml-100k [--source PATH] [--set key=value ...]

Flow: prepared dataset → :class:`TrialData` (numpy windows cropped to the model's ``max_len``) → epochs of the
chosen objective → validation metrics each epoch → early stopping on ``selection_metric`` (NDCG@10 by default). Test
metrics are computed whenever validation improves, so the reported test figures always belong to the best-validation
epoch — even if a scheduler stops the trial early — and are never used to select anything. A per-epoch callback
receives an :class:`EpochReport`; Ray Tune hooks in there.
"""

from __future__ import annotations

import argparse
import copy
import random
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

import kernels
import models
from models import ConfigError, SeqRecModel
from study.errors import UserError, print_error
from study.train import efficiency
from study.train.config import (
    SELECTION_METRIC,
    TrainConfig,
    parse_assignments,
    read_settings_file,
    split_settings,
)
from study.train.cost import EpochCost, estimate_epoch
from study.train.metrics import EvalSplit, NonFiniteScores, evaluate, popularity_metrics, sample_negatives
from study.train.objectives import (
    history_prefix_windows,
    history_windows,
    resolve_cloze_window_step,
    resolve_objective,
)
from study.train.padding import trims_padding
from study.train.results import make_result, to_json_line
from study.train.state import (
    TrainingState,
    capture_rng,
    continuation,
    identity_changes,
    load_state,
    model_identity,
    restore_rng,
)
from study.train.step import NonFiniteLoss, TrainStep


@dataclass
class TrialData:
    """Everything a trial reads, as numpy arrays already cropped to one ``max_len``."""

    meta: dict
    train: np.ndarray  # (U, max_len + 1) left-padded windows of training items
    valid: EvalSplit
    test: EvalSplit
    item_popularity: np.ndarray  # (num_items + 1,) training counts

    @property
    def num_items(self) -> int:
        return int(self.meta["num_items"])

    @classmethod
    def from_prepared(cls, path: str | Path, max_len: int, train_rows: int | None = None) -> TrialData:
        """``train_rows=n`` keeps only the first n users' training windows (a streaming trial's probe sample)."""
        from study.data import load_prepared

        dataset = load_prepared(path, train_rows)
        stored = dataset.train.shape[1] - 1
        if max_len > stored:
            raise UserError(f"max_len={max_len} exceeds the {stored} items per window stored in {path}; "
                            f"prepare the dataset with --max-len {max_len} or more")
        indptr = np.asarray(dataset.history_indptr, dtype=np.int64)
        indices = np.asarray(dataset.history_indices, dtype=np.int64)
        lengths = np.diff(indptr)

        def split(windows: np.ndarray, held_out: int) -> EvalSplit:
            cropped = np.ascontiguousarray(windows[:, -(max_len + 1):])
            return EvalSplit(inputs=cropped[:, :-1], targets=cropped[:, -1].astype(np.int64),
                             history_items=indices, history_starts=indptr[:-1], history_lengths=lengths - held_out)

        return cls(meta=dataset.meta, train=np.ascontiguousarray(dataset.train[:, -(max_len + 1):]),
                   valid=split(dataset.valid, 2), test=split(dataset.test, 1),
                   item_popularity=dataset.item_popularity("train"))

    @property
    def width(self) -> int:
        """Items per input window (the ``max_len`` these arrays were cut for)."""
        return self.train.shape[1] - 1

    def cropped(self, max_len: int) -> TrialData:
        """The same data cut to a shorter ``max_len`` (the newest items kept); copies, so the arrays are writable."""
        if max_len > self.width:
            raise UserError(f"max_len={max_len} exceeds the {self.width} items per window of this data")

        def crop(split: EvalSplit) -> EvalSplit:
            return EvalSplit(inputs=np.array(split.inputs[:, -max_len:]), targets=split.targets,
                             history_items=split.history_items, history_starts=split.history_starts,
                             history_lengths=split.history_lengths)

        return TrialData(meta=self.meta, train=np.array(self.train[:, -(max_len + 1):]), valid=crop(self.valid),
                         test=crop(self.test), item_popularity=self.item_popularity)


@dataclass
class EpochReport:
    epoch: int
    train_loss: float
    valid: dict[str, float]
    best_epoch: int
    best_valid: dict[str, float]
    best_test: dict[str, float]
    epoch_time_s: float
    train_time_s: float
    throughput: float  # training sequences per second this epoch
    wall_time_s: float
    extra: dict[str, float] = field(default_factory=dict)
    # The trial's whole state after this epoch, built only when asked (checkpoints are not taken every epoch); it
    # shares the live model's tensors, so save it before the next epoch starts.
    snapshot: Callable[[], TrainingState] | None = field(default=None, repr=False, compare=False)

    def flat(self) -> dict[str, float]:
        """Flat metric names used in Tune reports and history.parquet."""
        row = {"epoch": self.epoch, "train_loss": self.train_loss, "best_epoch": self.best_epoch,
               "epoch_time_s": self.epoch_time_s, "throughput": self.throughput, "wall_time_s": self.wall_time_s}
        row.update({f"valid_{k}": v for k, v in self.valid.items()})
        row.update({f"best_valid_{k}": v for k, v in self.best_valid.items()})
        row.update({f"test_{k}": v for k, v in self.best_test.items()})
        return row


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device={name} requested but CUDA is not available on this machine")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


Batch = tuple[np.ndarray, np.ndarray | None]  # (windows (B, L + 1), their user ids (B,) or None)


def user_batches(windows: np.ndarray, batch_size: int, rng: np.random.Generator) -> Iterable[Batch]:
    """Shuffled batches of user windows that hold at least one (input, target) pair, with their user ids
    (rows of the prepared windows are users 0..U-1)."""
    trainable = np.flatnonzero((windows[:, :-1] > 0).any(1) & (windows[:, -1] > 0))
    order = rng.permutation(trainable)
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        yield windows[rows], rows


def with_user_count(model_name: str, model_hparams: dict, meta: dict) -> dict:
    """Add ``num_users`` from the dataset for models that read user ids; a different value given by hand is an error."""
    if not models.model_class(model_name).needs_users:
        return model_hparams
    num_users = int(meta["num_users"])
    if model_hparams.get("num_users", num_users) != num_users:
        raise UserError(f"num_users={model_hparams['num_users']} but {meta.get('name', 'the dataset')} has "
                        f"{num_users} users; set it to {num_users} (or leave it unset: the trainer sizes it)")
    return {**model_hparams, "num_users": num_users}


def epoch_windows(data: TrialData, users: Iterable[Batch | np.ndarray], objective: str, train_cfg: TrainConfig,
                  rng: np.random.Generator) -> Iterator[Batch]:
    """One epoch's training batches as ``(windows, user ids or None)``. Most objectives train on the user windows
    as they come (a source without user ids, such as a Ray Data shard, yields bare windows). ``last``, and
    ``cloze`` with a non-zero ``cloze_window_step`` (``train_cfg`` holds resolved settings: ``None`` is cloze's
    default, not 0), build their windows from every user's whole training history, which every trial holds in
    ``data`` (the validation split's histories end right before the validation target), so they never read
    ``users``.
    """
    histories = data.valid
    max_len = data.train.shape[1] - 1
    if objective == "last":
        yield from history_prefix_windows(histories.history_items, histories.history_starts,
                                          histories.history_lengths, max_len, train_cfg.prefixes_per_user,
                                          train_cfg.batch_size, rng, with_users=True)
    elif objective == "cloze" and train_cfg.cloze_window_step:
        yield from history_windows(histories.history_items, histories.history_starts, histories.history_lengths,
                                   max_len, train_cfg.cloze_window_step, train_cfg.batch_size, rng, with_users=True)
    else:
        for batch in users:
            yield batch if isinstance(batch, tuple) else (batch, None)


def run_trial(model_name: str, data: TrialData | str | Path, settings: dict | None = None, *,
              callback: Callable[[EpochReport], None] | None = None, progress: bool = False,
              train_batches: Callable[[int], Iterable[np.ndarray]] | None = None,
              resume_from: TrainingState | None = None) -> dict:
    """Train and evaluate one configuration; returns one result row (see :mod:`study.train.results`).

    ``settings`` holds trainer, protocol and model keys (strings are coerced). ``train_batches``, if
    given, yields the epoch's user windows (e.g. from a Ray Data shard) instead of the in-memory shuffle.
    ``resume_from`` continues after the epoch a :class:`~study.train.state.TrainingState` was taken at (each
    report's ``snapshot()``), with the same settings: the result equals that of a run never stopped.
    """
    started = time.perf_counter() - (resume_from.elapsed_s if resume_from else 0.0)
    train_cfg, model_hparams = split_settings(model_name, settings or {})
    max_len = model_hparams.get("max_len", models.model_class(model_name).config_class.max_len)
    if not isinstance(data, TrialData):
        data = TrialData.from_prepared(data, max_len)
    elif data.width > max_len:  # windows prepared for a longer model: keep each one's newest max_len items
        data = data.cropped(max_len)
    model_hparams = with_user_count(model_name, {**model_hparams, "num_items": data.num_items, "max_len": max_len},
                                    data.meta)
    if train_cfg.num_threads:
        torch.set_num_threads(train_cfg.num_threads)
    device = resolve_device(train_cfg.device)
    seed_everything(train_cfg.seed)

    model = models.build(model_name, **model_hparams).to(device)
    kernels.reset_backend_record()  # the row's kernel_path names this trial's kernels, not an earlier trial's
    step = TrainStep(model, train_cfg, item_popularity=data.item_popularity)
    objective = step.objective
    train_cfg = step.train  # its `auto` settings resolved (padding trim, cloze windows): the row records what ran
    if train_batches is not None and (objective == "last" or train_cfg.cloze_window_step):
        # the sweep refuses these studies; a direct call would silently train every worker on every user
        raise UserError(f"objective {objective!r} with cloze_window_step {train_cfg.cloze_window_step} trains on "
                        "windows of every user's whole history, not on the batches train_batches gives "
                        "(set cloze_window_step: 0 to train cloze on those)")
    rng = np.random.default_rng(train_cfg.seed)

    negatives = {}
    if train_cfg.eval_mode == "sampled":
        popularity = data.item_popularity if train_cfg.negative_sampler == "popularity" else None
        negatives = {name: sample_negatives(split, data.num_items, train_cfg.num_negatives, popularity,
                                            seed=train_cfg.seed + offset)
                     for offset, (name, split) in enumerate((("valid", data.valid), ("test", data.test)))}

    def score(split_name: str) -> dict[str, float]:
        split = data.valid if split_name == "valid" else data.test
        # strict: a model that scores targets NaN/inf fails the trial; such an epoch is never selected nor reported
        return evaluate(model, split, batch_size=train_cfg.eval_batch_size, device=device,
                        mask_history=train_cfg.mask_history, negatives=negatives.get(split_name), strict=True,
                        trim=train_cfg.trim_padding)

    selection = train_cfg.selection_metric
    best_valid: dict[str, float] = {}
    best_test: dict[str, float] = {}
    best_epoch, best_state, epochs_without_gain = 0, None, 0
    epoch_times, throughputs, reports = [], [], []
    first_epoch = 1
    identity = model_identity(model_name, model.config.to_dict(), asdict(train_cfg), data.meta)
    # checked before the weights load, where a changed model size would fail with torch's shape error instead
    if resume_from is not None and (changes := identity_changes(resume_from.identity, identity)):
        # e.g. a state written before `cloze_window_step` existed does not record it, and today's default trains on
        # windows over the whole history, not on the newest window it trained on: the continued epochs would be
        # another run
        raise UserError(f"the training state of epoch {resume_from.epoch} was written by a run that trained "
                        f"otherwise: {'; '.join(changes)}. Continuing it would train another configuration than "
                        "its earlier epochs did; rerun the trial instead")
    if resume_from is not None:
        model.load_state_dict(resume_from.model)
        step.optimizer.load_state_dict(resume_from.optimizer)
        restore_rng(resume_from.rng, rng, step.generator)
        best_valid, best_test = dict(resume_from.best_valid), dict(resume_from.best_test)
        best_epoch, best_state = resume_from.best_epoch, resume_from.best_weights
        epochs_without_gain = resume_from.epochs_without_gain
        epoch_times, throughputs = list(resume_from.epoch_times), list(resume_from.throughputs)
        first_epoch = resume_from.epoch + 1

    def snapshot(epoch: int) -> TrainingState:
        return TrainingState(epoch=epoch, model=model.state_dict(), optimizer=step.optimizer.state_dict(),
                             rng=capture_rng(rng, step.generator), best_valid=dict(best_valid),
                             best_test=dict(best_test), best_epoch=best_epoch, best_weights=best_state,
                             epochs_without_gain=epochs_without_gain, epoch_times=list(epoch_times),
                             throughputs=list(throughputs), elapsed_s=time.perf_counter() - started,
                             identity=identity)

    steps_per_epoch = None
    if progress:  # a person is watching: say what an epoch will cost before spending it
        cost = epoch_cost(step, data, train_cfg, device)
        print(cost.line(train_cfg.max_epochs), file=sys.stderr, flush=True)
        steps_per_epoch = cost.steps
    bar = _progress_bar(train_cfg.max_epochs, steps_per_epoch, model_name, progress)
    bar.update((first_epoch - 1) * (steps_per_epoch or 1))
    interrupted = False
    finished = (best_valid, best_test, best_epoch, best_state, epochs_without_gain)  # as of the last full epoch
    try:
        for epoch in range(first_epoch, train_cfg.max_epochs + 1):
            epoch_start = time.perf_counter()
            model.train()
            users = train_batches(epoch) if train_batches else user_batches(data.train, train_cfg.batch_size, rng)
            total_loss, sequences, steps = 0.0, 0, 0
            for windows, window_users in epoch_windows(data, users, objective, train_cfg, rng):
                batch = torch.as_tensor(windows, dtype=torch.long, device=device)
                batch_users = batch_user_ids(model, window_users, device)
                try:
                    loss = step(batch, check_finite=True, users=batch_users)
                except NonFiniteLoss as error:
                    raise NonFiniteLoss(f"{error} at epoch {epoch}, step {steps + 1}") from None
                total_loss += loss.item()
                sequences += len(windows)
                steps += 1
                if steps_per_epoch:
                    bar.update(1)
            train_time = time.perf_counter() - epoch_start
            try:
                valid = score("valid")
            except NonFiniteScores as error:
                raise NonFiniteScores(f"validation after epoch {epoch}: {error}") from None
            if not best_valid or valid[selection] > best_valid[selection]:
                best_valid, best_epoch, epochs_without_gain = valid, epoch, 0
                best_test = score("test")
                best_state = copy.deepcopy(model.state_dict())
            else:
                epochs_without_gain += 1
            epoch_time = time.perf_counter() - epoch_start
            epoch_times.append(epoch_time)
            throughputs.append(sequences / train_time if train_time > 0 else float("nan"))
            report = EpochReport(epoch=epoch, train_loss=total_loss / max(steps, 1), valid=valid, best_epoch=best_epoch,
                                 best_valid=best_valid, best_test=best_test, epoch_time_s=epoch_time,
                                 train_time_s=train_time, throughput=throughputs[-1],
                                 wall_time_s=time.perf_counter() - started, extra=model.stats(),
                                 snapshot=lambda epoch=epoch: snapshot(epoch))
            reports.append(report)
            finished = (best_valid, best_test, best_epoch, best_state, epochs_without_gain)
            if not steps_per_epoch:
                bar.update(1)
            bar.set_postfix({"epoch": epoch, "loss": f"{report.train_loss:.3f}", selection: f"{valid[selection]:.4f}",
                             "best": f"{best_valid[selection]:.4f}@{best_epoch}"})
            if callback is not None:
                callback(report)
            if train_cfg.patience and epochs_without_gain >= train_cfg.patience:
                break
            if train_cfg.time_budget_s and time.perf_counter() - started >= train_cfg.time_budget_s:
                break
    except KeyboardInterrupt:
        if not progress:  # inside a sweep, Ray owns the signal
            raise
        # Ctrl-C anywhere in an epoch (training, evaluation, reporting): drop that epoch, keep the finished ones
        best_valid, best_test, best_epoch, best_state, epochs_without_gain = finished
        interrupted = True
    bar.close()
    if interrupted and best_state is None:
        raise KeyboardInterrupt
    if interrupted:
        done = first_epoch - 1 + len(reports)
        print(f"interrupted during epoch {done + 1}: the result below is that of the {done} "
              "finished epoch(s)", file=sys.stderr, flush=True)

    model.load_state_dict(best_state)
    figures = {"params": efficiency.count_parameters(model), "epoch_time_s": float(np.median(epoch_times)),
               "train_throughput": float(np.median(throughputs))}
    if train_cfg.measure_efficiency and not interrupted:
        figures.update(efficiency_figures(model_name, model_hparams, train_cfg, data, model, device))
    row = make_result(
        model=model_name, dataset_meta=data.meta, objective=objective, train_cfg=train_cfg,
        model_hparams=model.config.to_dict(),
        best_valid=best_valid, best_test=best_test, best_epoch=best_epoch,
        epochs_run=first_epoch - 1 + len(reports),
        efficiency=figures, device=device, extra=model.stats(), wall_time_s=time.perf_counter() - started,
        popularity={f"pop_{k}": v for k, v in popularity_metrics(data.test, data.item_popularity,
                                                                   negatives=negatives.get("test"),
                                                                   mask_history=train_cfg.mask_history).items()
                    if k == SELECTION_METRIC},
    )
    if interrupted:
        row["status"] = "interrupted"
    return row


def batch_user_ids(model: SeqRecModel, users: np.ndarray | None, device: torch.device) -> torch.Tensor | None:
    """The batch's user ids as a tensor for models that read them (``needs_users``), else None."""
    if not model.needs_users:
        return None
    if users is None:
        raise UserError(f"{type(model).__name__} reads user ids, but this batch source carries windows only")
    return torch.as_tensor(users, dtype=torch.long, device=device)


def epoch_cost(step: TrainStep, data: TrialData, train_cfg: TrainConfig, device: torch.device) -> EpochCost:
    """The cost of one epoch of this trial, as the trainer runs it: the data loader drawing the epoch's windows,
    the training steps, and the validation pass over every user (its batches drawn with a separate generator:
    training is unchanged)."""
    rng = np.random.default_rng(train_cfg.seed)
    started = time.perf_counter()
    batches = [(windows, batch_user_ids(step.model, users, device)) for windows, users in
               epoch_windows(data, user_batches(data.train, train_cfg.batch_size, rng), step.objective, train_cfg, rng)]
    loader_s = time.perf_counter() - started
    started = time.perf_counter()
    with torch.no_grad():
        evaluate(step.model, data.valid, batch_size=train_cfg.eval_batch_size, device=device,
                 mask_history=train_cfg.mask_history, trim=train_cfg.trim_padding)
    validation_s = time.perf_counter() - started
    return estimate_epoch(step, batches, device, float(data.meta.get("length", {}).get("median", float("nan"))),
                          overhead_s=loader_s + validation_s)


def efficiency_figures(model_name: str, model_hparams: dict, train_cfg: TrainConfig, data: TrialData,
                        model: SeqRecModel, device: torch.device) -> dict:
    windows = user_batches(data.train, train_cfg.batch_size, np.random.default_rng(0))
    objective = resolve_objective(model, train_cfg.objective)
    train_cfg = replace(train_cfg, cloze_window_step=resolve_cloze_window_step(
        objective, train_cfg.cloze_window_step, model.config.max_len, model_name))
    settings = {**asdict(train_cfg), "objective": objective}
    batch, users = next(epoch_windows(data, windows, settings["objective"], train_cfg, np.random.default_rng(0)))
    try:
        threads = train_cfg.num_threads or torch.get_num_threads()
        peak_mb, method = efficiency.peak_train_memory_mb(model_name, model_hparams, settings, batch, device,
                                                          num_threads=threads, users=users)
    except RuntimeError as error:
        peak_mb, method = float("nan"), f"failed: {error}"
    test_users = np.arange(len(data.test.inputs)) if model.needs_users else None  # split rows are users 0..U-1
    p50, p95 = efficiency.inference_latency_ms(model, data.test.inputs, device, users=test_users,
                                               trim=trims_padding(train_cfg.trim_padding, device, train_cfg.compile))
    return {"peak_mem_mb": peak_mb, "peak_mem_method": method, "infer_ms_p50": p50, "infer_ms_p95": p95}


def _progress_bar(epochs: int, steps_per_epoch: int | None, description: str, enabled: bool):
    """A bar over training steps when their number is known (long epochs visibly move), else over epochs."""
    from tqdm.auto import tqdm

    if steps_per_epoch:
        return tqdm(total=epochs * steps_per_epoch, desc=description, unit="step", disable=not enabled,
                    file=sys.stderr, leave=True, dynamic_ncols=True)
    return tqdm(total=epochs, desc=description, unit="epoch", disable=not enabled, file=sys.stderr, leave=True)


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
        train_cfg, model_hparams = split_settings(model_name, settings)
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

