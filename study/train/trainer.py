"""The one trainer: fit a registry model on a prepared dataset, evaluate, and record one result row.

    python -m study.train --model sasrec --dataset ml-100k [--source PATH] [--set key=value ...]   (study.train.cli)

Flow: prepared dataset → :class:`TrialData` (numpy windows cropped to the model's ``max_len``) → epochs of the
chosen objective → validation metrics each epoch → early stopping on ``selection_metric`` (NDCG@10 by default). Test
metrics are computed whenever validation improves, so the reported test figures always belong to the best-validation
epoch — even if a scheduler stops the trial early — and are never used to select anything. A per-epoch callback
receives an :class:`EpochReport`; Ray Tune hooks in there. :func:`run_trial` calls the phases of one trial (build,
resume, epochs, result row), each a method of :class:`_Trial`. The data it reads is :mod:`study.train.trial_data`'s
and the epoch's batches are :mod:`study.train.batches`'; this module re-exports both modules' names.
"""

from __future__ import annotations

import copy
import math
import random
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

import kernels
import models
from study.errors import UserError
from study.train import efficiency, energy
from study.train.batches import batch_user_ids, epoch_windows, user_batches
from study.train.config import (
    SELECTION_METRIC,
    TrainConfig,
    split_settings,
)
from study.train.cost import epoch_cost
from study.train.ctrl_c import noting_ctrl_c
from study.train.metrics import (
    NonFiniteScores,
    metrics_from_ranks,
    popularity_metrics,
    sample_negatives,
    target_ranks,
)
from study.train.objectives import trains_on_histories
from study.train.results import make_result
from study.train.state import (
    TrainingState,
    capture_rng,
    identity_changes,
    model_identity,
    restore_rng,
)
from study.train.step import NonFiniteLoss, TrainStep
from study.train.trial_data import TrialData


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
    extra: dict[str, float] = field(default_factory=dict)  # the model's statistics after this epoch (stats())
    # and after the best epoch so far, whose metrics best_valid/best_test are: what a result row records
    best_extra: dict[str, float] = field(default_factory=dict)
    train_energy_j: float = float("nan")  # the device's energy over this epoch's training steps (study.train.energy)
    # each validation user's rank of its target after this epoch (study.train.metrics.target_ranks), in the split's
    # user order: `valid` holds their means, and a statistic over users (a split of them, a paired test) reads these
    valid_ranks: np.ndarray | None = field(default=None, repr=False, compare=False)
    # The trial's whole state after this epoch, built only when asked (checkpoints are not taken every epoch); it
    # shares the live model's tensors, so save it before the next epoch starts.
    snapshot: Callable[[], TrainingState] | None = field(default=None, repr=False, compare=False)

    def flat(self) -> dict[str, float]:
        """Flat metric names used in Tune reports and history.parquet."""
        row = {"epoch": self.epoch, "train_loss": self.train_loss, "best_epoch": self.best_epoch,
               "epoch_time_s": self.epoch_time_s, "throughput": self.throughput, "wall_time_s": self.wall_time_s,
               "train_energy_j": self.train_energy_j}
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


def with_user_count(model_name: str, model_hparams: dict, meta: dict) -> dict:
    """Add ``num_users`` from the dataset for models that read user ids; a different value given by hand is an error."""
    if not models.model_class(model_name).needs_users:
        return model_hparams
    num_users = int(meta["num_users"])
    if model_hparams.get("num_users", num_users) != num_users:
        raise UserError(f"num_users={model_hparams['num_users']} but {meta.get('name', 'the dataset')} has "
                        f"{num_users} users; set it to {num_users} (or leave it unset: the trainer sizes it)")
    return {**model_hparams, "num_users": num_users}


def run_trial(model_name: str, data: TrialData | str | Path, settings: dict | None = None, *,
              callback: Callable[[EpochReport], None] | None = None, progress: bool = False,
              train_batches: Callable[[int], Iterable[np.ndarray]] | None = None,
              resume_from: TrainingState | None = None, measure_energy: bool = True) -> dict:
    """Train and evaluate one configuration; returns one result row (see :mod:`study.train.results`).

    ``settings`` holds trainer, protocol and model keys (strings are coerced). ``train_batches``, if
    given, yields the epoch's user windows (e.g. from a Ray Data shard) instead of the in-memory shuffle.
    ``resume_from`` continues after the epoch a :class:`~study.train.state.TrainingState` was taken at (each
    report's ``snapshot()``), with the same settings: the result equals that of a run never stopped.
    ``measure_energy``: read the device's energy counter around each epoch's training steps
    (:mod:`study.train.energy`); a data-parallel worker does not, since its device holds one replica of several.

    The phases are the methods of :class:`_Trial`, called here in order: build, resume, the epochs, the result row.
    """
    # the clock starts before anything is built; a resumed trial's wall time includes its earlier epochs
    started = time.perf_counter() - (resume_from.elapsed_s if resume_from else 0.0)
    trial = _Trial(model_name, data, settings or {}, started=started, train_batches=train_batches,
                   measure_energy=measure_energy)
    if resume_from is not None:
        trial.resume(resume_from)
    interrupted = trial.run_epochs(callback, progress)
    return trial.result_row(interrupted)


def _fit_to_model(model_name: str, data: TrialData | str | Path, settings: dict) -> tuple[TrainConfig, dict, TrialData]:
    """The settings split into trainer and model keys, and the data cut to the model's ``max_len``.

    Windows prepared for a longer model keep each one's newest ``max_len`` items. ``num_items`` (and ``num_users``,
    for a model that reads user ids) come from the data, so that the model's embeddings fit it.
    """
    train_cfg, model_hparams = split_settings(model_name, settings)
    max_len = model_hparams.get("max_len", models.model_class(model_name).config_class.max_len)
    if not isinstance(data, TrialData):
        data = TrialData.from_prepared(data, max_len)
    elif data.width > max_len:
        data = data.cropped(max_len)
    model_hparams = with_user_count(model_name, {**model_hparams, "num_items": data.num_items, "max_len": max_len},
                                    data.meta)
    return train_cfg, model_hparams, data


# the seeds of the evaluation negatives, after the trial's seed: each split has its own
NEGATIVE_SEED_OFFSETS = {"valid": 0, "test": 1}


def _eval_negatives(data: TrialData, train_cfg: TrainConfig) -> dict[str, np.ndarray]:
    """Each split's negatives under sampled evaluation, drawn once per trial from seeds of their own, so that every
    epoch ranks against the same items. Under full ranking, only the test negatives of ``sampled_test_negatives``
    (uniform, from the test split's seed: the ones eval_mode ``sampled`` would draw for the same count), as
    ``sampled_test``; none without it."""
    seeds = {name: train_cfg.seed + offset for name, offset in NEGATIVE_SEED_OFFSETS.items()}
    if train_cfg.eval_mode != "sampled":
        if not train_cfg.sampled_test_negatives:
            return {}
        return {"sampled_test": sample_negatives(data.test, data.num_items, train_cfg.sampled_test_negatives, None,
                                                 seed=seeds["test"])}
    popularity = data.item_popularity if train_cfg.negative_sampler == "popularity" else None
    return {name: sample_negatives(split, data.num_items, train_cfg.num_negatives, popularity, seed=seeds[name])
            for name, split in (("valid", data.valid), ("test", data.test))}


@dataclass
class _Standing:
    """Early stopping's state: the best validation figures so far, that epoch's test figures and weights, and how
    many epochs since did not beat it. One object, so that Ctrl-C can put back its copy from the last full epoch."""

    valid: dict[str, float] = field(default_factory=dict)
    test: dict[str, float] = field(default_factory=dict)
    epoch: int = 0
    weights: dict | None = None
    extra: dict[str, float] = field(default_factory=dict)  # the model's stats() at that epoch (ELASTIC's usage)
    epochs_without_gain: int = 0


class _Trial:
    """One call of :func:`run_trial`: its phases as methods sharing the trial's state (data, model, training step,
    random generators, early-stopping standing, per-epoch figures), so that each phase reads, and is named, alone.

    The order of the calls is part of a seed's meaning (weights, batches, negatives and masks are all drawn from
    it), so :func:`run_trial` is the only caller and calls each phase at most once, in order.
    """

    def __init__(self, model_name: str, data: TrialData | str | Path, settings: dict, *, started: float,
                 train_batches: Callable[[int], Iterable[np.ndarray]] | None, measure_energy: bool = True) -> None:
        """The build: data fitted to the model, the seeded model and its training step, the batch shuffle's
        generator and the evaluation negatives. A setting the trial cannot honour fails here, before any epoch."""
        self.model_name, self.started, self.train_batches = model_name, started, train_batches
        train_cfg, self.model_hparams, self.data = _fit_to_model(model_name, data, settings)
        if train_cfg.num_threads:
            torch.set_num_threads(train_cfg.num_threads)
        self.device = resolve_device(train_cfg.device)
        seed_everything(train_cfg.seed)
        self.model = models.build(model_name, **self.model_hparams).to(self.device)
        kernels.reset_backend_record()  # the row's kernel_path names this trial's kernels, not an earlier trial's
        self.step = TrainStep(self.model, train_cfg, item_popularity=self.data.item_popularity)
        self.objective = self.step.objective
        # its `auto` settings resolved (padding trim, cloze windows): the row records what ran
        self.train_cfg = train_cfg = self.step.train
        if train_batches is not None and trains_on_histories(self.objective, train_cfg.window_step):
            # the sweep refuses these studies; a direct call would silently train every worker on every user
            raise UserError(f"objective {self.objective!r} with window_step {train_cfg.window_step} trains on "
                            "windows of every user's whole history, not on the batches train_batches gives (set "
                            "window_step: 0 to train on those)")
        self.rng = np.random.default_rng(train_cfg.seed)
        self.negatives = _eval_negatives(self.data, train_cfg)
        self.best = _Standing()
        self.epoch_times: list[float] = []
        self.throughputs: list[float] = []
        self.train_energies: list[float] = []
        self.energy = energy.open_counter(self.device) if measure_energy else None
        self.epochs_run = 0  # the last epoch reported; a resumed trial starts after its state's
        self.identity = model_identity(model_name, self.model.config.to_dict(), asdict(train_cfg), self.data.meta)

    def resume(self, state: TrainingState) -> None:
        """Take over a saved state (``resume_from``): weights, optimizer, every generator, early stopping's standing
        and the per-epoch figures, so that the next epoch is the one an unstopped run would train.

        The state's identity is checked first: a changed model size would otherwise fail in the weights' load with
        torch's shape error, and a changed training setting would not fail at all.
        """
        if changes := identity_changes(state.identity, self.identity):
            # e.g. a state that trained on each user's newest window, continued under today's default, which trains
            # on windows over the whole history: the continued epochs would be another run
            raise UserError(f"the training state of epoch {state.epoch} was written by a run that trained "
                            f"otherwise: {'; '.join(changes)}. Continuing it would train another configuration than "
                            "its earlier epochs did; rerun the trial instead")
        self.model.load_state_dict(state.model)
        self.step.optimizer.load_state_dict(state.optimizer)
        restore_rng(state.rng, self.rng, self.step.generator)
        self.best = _Standing(valid=dict(state.best_valid), test=dict(state.best_test), epoch=state.best_epoch,
                              weights=state.best_weights, epochs_without_gain=state.epochs_without_gain,
                              extra=self._best_extra(state))
        self.epoch_times, self.throughputs = list(state.epoch_times), list(state.throughputs)
        self.train_energies = list(state.train_energies)
        self.epochs_run = state.epoch

    def _best_extra(self, state: TrainingState) -> dict[str, float]:
        """The best epoch's model statistics; a state written before it recorded them has them from its weights
        (ELASTIC's usage counts are a buffer of the state dict)."""
        if state.best_extra is not None or state.best_weights is None:
            return dict(state.best_extra or {})
        best = copy.deepcopy(self.model)
        best.load_state_dict(state.best_weights)
        return best.stats()

    def snapshot(self, epoch: int) -> TrainingState:
        """The trial's whole state after ``epoch`` (a report's ``snapshot()``): built only when asked, since
        checkpoints are not taken every epoch; it shares the live model's tensors."""
        best = self.best
        return TrainingState(epoch=epoch, model=self.model.state_dict(), optimizer=self.step.optimizer.state_dict(),
                             rng=capture_rng(self.rng, self.step.generator), best_valid=dict(best.valid),
                             best_test=dict(best.test), best_epoch=best.epoch, best_weights=best.weights,
                             best_extra=dict(best.extra),
                             epochs_without_gain=best.epochs_without_gain, epoch_times=list(self.epoch_times),
                             throughputs=list(self.throughputs), train_energies=list(self.train_energies),
                             elapsed_s=time.perf_counter() - self.started,
                             identity=self.identity)

    def run_epochs(self, callback: Callable[[EpochReport], None] | None, progress: bool) -> bool:
        """The epochs, each reported to ``callback``, until ``max_epochs``, early stopping or the trial's time budget;
        returns whether Ctrl-C ended them.

        Ctrl-C is caught only with ``progress`` (a person at the terminal; inside a sweep Ray owns the signal): the
        epoch it lands in is dropped and the finished ones make the result (one that a destructor swallowed ends the
        run after that epoch, which then counts). With none finished it goes on up.
        """
        bar, steps_per_epoch = self._progress(progress)
        interrupted, stop = False, ""
        finished = replace(self.best)  # as of the last full epoch
        try:
            with noting_ctrl_c(active=progress) as pressed:
                for epoch in range(self.epochs_run + 1, self.train_cfg.max_epochs + 1):
                    report = self._epoch(epoch, bar, steps_per_epoch)
                    finished = replace(self.best)
                    self._show(bar, report, steps_per_epoch)
                    if callback is not None:
                        callback(report)
                    if pressed.is_set():  # its KeyboardInterrupt was swallowed (study.train.ctrl_c): stop here
                        raise KeyboardInterrupt
                    stop = self._stop_reason()
                    if stop:
                        break
                else:
                    stop = f"max_epochs ({self.train_cfg.max_epochs}) reached"
        except KeyboardInterrupt:
            if not progress:  # inside a sweep, Ray owns the signal
                raise
            # Ctrl-C anywhere in an epoch (training, evaluation, reporting): drop that epoch, keep the finished ones
            self.best = finished
            interrupted = True
        bar.close()
        if interrupted and self.best.weights is None:
            raise KeyboardInterrupt
        if interrupted:
            print(f"interrupted during epoch {self.epochs_run + 1}: the result below is that of the {self.epochs_run} "
                  "finished epoch(s)", file=sys.stderr, flush=True)
        elif progress and stop:  # a person watching is told why the bar stopped short
            selection = self.train_cfg.selection_metric
            print(f"stopped after epoch {self.epochs_run}: {stop}; the result is that of epoch {self.best.epoch} "
                  f"(valid {selection} {self.best.valid.get(selection, 0.0):.4f})", file=sys.stderr, flush=True)
        return interrupted

    def _progress(self, progress: bool) -> tuple[Any, int | None]:
        """The progress bar, moved past a resumed trial's epochs, and the steps per epoch when known. A person
        watching (``progress``) is first told what an epoch will cost, before it is spent; the bar then counts
        steps, so that a long epoch visibly moves."""
        steps_per_epoch = None
        if progress:
            cost = epoch_cost(self.step, self.data, self.train_cfg, self.device)
            line, budget = cost.line(self.train_cfg.max_epochs), self.train_cfg.time_budget_s
            line += f"\n  {self.train_cfg.schedule_text(cost.steps)}"
            # the bar counts up to max_epochs: say where a shorter budget will cut it (the epoch crossing it finishes)
            left = self.train_cfg.max_epochs - self.epochs_run  # a resumed trial's budget counts from this run
            fit = math.ceil(budget / cost.epoch_s) if budget and cost.epoch_s > 0 else left
            if fit < left:
                line += f"\n  the time budget of {budget:g} s ends training after about {max(fit, 1)} epoch(s)"
            print(line, file=sys.stderr, flush=True)
            steps_per_epoch = cost.steps
        bar = _progress_bar(self.train_cfg.max_epochs, steps_per_epoch, self.model_name, progress)
        bar.update(self.epochs_run * (steps_per_epoch or 1))
        return bar, steps_per_epoch

    def _epoch(self, epoch: int, bar: Any, steps_per_epoch: int | None) -> EpochReport:
        """One epoch: train, validate (keeping the best), record its time, throughput and training energy; returns
        its report. The energy counter is read once before and once after the training steps: validation is not in
        it."""
        epoch_start, energy_start = time.perf_counter(), energy.read_j(self.energy, self.device)
        total_loss, sequences, steps = self._train(epoch, bar, steps_per_epoch)
        train_time = time.perf_counter() - epoch_start
        train_energy = energy.read_j(self.energy, self.device) - energy_start
        valid, valid_ranks = self._validate(epoch)
        epoch_time = time.perf_counter() - epoch_start
        self.epoch_times.append(epoch_time)
        self.throughputs.append(sequences / train_time if train_time > 0 else float("nan"))
        self.train_energies.append(train_energy)
        best = self.best
        report = EpochReport(epoch=epoch, train_loss=total_loss / max(steps, 1), valid=valid, best_epoch=best.epoch,
                             best_valid=best.valid, best_test=best.test, epoch_time_s=epoch_time,
                             train_time_s=train_time, throughput=self.throughputs[-1],
                             wall_time_s=time.perf_counter() - self.started, extra=self.model.stats(),
                             train_energy_j=self.train_energies[-1], best_extra=best.extra,
                             valid_ranks=valid_ranks, snapshot=partial(self.snapshot, epoch))
        self.epochs_run = epoch
        return report

    def _train(self, epoch: int, bar: Any, steps_per_epoch: int | None) -> tuple[float, int, int]:
        """The epoch's training steps; returns the summed loss, the sequences and the steps. The batches come from
        ``train_batches`` when given, else from the trial's own seeded shuffle. A non-finite loss fails the trial,
        naming the epoch and step, so that a diverged run is never mistaken for a weak one."""
        self.model.train()
        train_cfg = self.train_cfg
        users = (self.train_batches(epoch) if self.train_batches
                 else user_batches(self.data.train, train_cfg.batch_size, self.rng))
        total_loss, sequences, steps = 0.0, 0, 0
        for windows, window_users, scored in epoch_windows(self.data, users, self.objective, train_cfg, self.rng):
            batch = torch.as_tensor(windows, dtype=torch.long, device=self.device)
            batch_users = batch_user_ids(self.model, window_users, self.device)
            batch_scored = None if scored is None else torch.as_tensor(scored, device=self.device)
            try:
                loss = self.step(batch, check_finite=True, users=batch_users, scored=batch_scored)
            except NonFiniteLoss as error:
                raise NonFiniteLoss(f"{error} at epoch {epoch}, step {steps + 1}") from None
            total_loss += loss.item()
            sequences += len(windows)
            steps += 1
            if steps_per_epoch:
                bar.update(1)
        return total_loss, sequences, steps

    def _validate(self, epoch: int) -> tuple[dict[str, float], np.ndarray]:
        """The epoch's validation metrics and each validation user's rank, and early stopping's bookkeeping. An
        epoch that beats the best ``selection_metric`` so far becomes the best: only then is the test split scored and
        the weights copied, so that the test figures always belong to the best-validation epoch and never select
        anything."""
        try:
            ranks = self._ranks("valid")
        except NonFiniteScores as error:
            raise NonFiniteScores(f"validation after epoch {epoch}: {error}") from None
        valid = metrics_from_ranks(ranks)
        best, selection = self.best, self.train_cfg.selection_metric
        if not best.valid or valid[selection] > best.valid[selection]:
            best.valid, best.epoch, best.epochs_without_gain = valid, epoch, 0
            best.test = self._test_scores()
            best.weights = copy.deepcopy(self.model.state_dict())
            best.extra = self.model.stats()  # of the validation pass: a test pass counts nothing (ELASTIC)
        else:
            best.epochs_without_gain += 1
            self._decay_lr_on_plateau()
        return valid, ranks.numpy()

    def _decay_lr_on_plateau(self) -> None:
        """Every ``lr_decay_patience`` epochs without a gain, multiply the learning rate by ``lr_decay_factor``.
        The rate lives in the optimizer's state, so a checkpointed trial resumes at the rate it had reached."""
        every = self.train_cfg.lr_decay_patience
        if every and self.best.epochs_without_gain % every == 0:
            for group in self.step.optimizer.param_groups:
                group["lr"] *= self.train_cfg.lr_decay_factor

    def _score(self, split_name: str, negatives: str | None = None) -> dict[str, float]:
        """Metrics on one split (``valid`` or ``test``) with the trial's evaluation protocol, or against the
        negatives stored under ``negatives`` (``sampled_test``)."""
        return metrics_from_ranks(self._ranks(split_name, negatives))

    def _ranks(self, split_name: str, negatives: str | None = None) -> torch.Tensor:
        """Each user's rank of its target on one split, as :meth:`_score` takes its metrics from."""
        split = self.data.valid if split_name == "valid" else self.data.test
        train_cfg = self.train_cfg
        # strict: a model that scores targets NaN/inf fails the trial; such an epoch is never selected nor reported
        return target_ranks(self.model, split, batch_size=train_cfg.eval_batch_size, device=self.device,
                            mask_history=train_cfg.mask_history, negatives=self.negatives.get(negatives or split_name),
                            strict=True, trim=train_cfg.trim_padding)

    def _test_scores(self) -> dict[str, float]:
        """The test metrics of the protocol, and against the ``sampled_test_negatives`` where they are set, as
        ``sampled_<metric>`` (rows ``test_sampled_<metric>``)."""
        scores = self._score("test")
        if "sampled_test" in self.negatives:  # history masking never applies: sampled negatives hold no history item
            scores.update({f"sampled_{k}": v for k, v in self._score("test", "sampled_test").items()})
        return scores

    def _show(self, bar: Any, report: EpochReport, steps_per_epoch: int | None) -> None:
        """The bar after an epoch: one step when it counts epochs, and the loss, this epoch's and the best
        ``selection_metric``."""
        selection = self.train_cfg.selection_metric
        if not steps_per_epoch:
            bar.update(1)
        bar.set_postfix({"epoch": report.epoch, "loss": f"{report.train_loss:.3f}",
                         selection: f"{report.valid[selection]:.4f}",
                         "best": f"{report.best_valid[selection]:.4f}@{report.best_epoch}"})

    def _stop_reason(self) -> str:
        """Why to stop after this epoch, or "" to go on: ``patience`` epochs without a gain, or the trial's
        ``time_budget_s`` spent (checked between epochs, so a started epoch always finishes)."""
        train_cfg = self.train_cfg
        if train_cfg.patience and self.best.epochs_without_gain >= train_cfg.patience:
            return f"no gain in {train_cfg.selection_metric} for {train_cfg.patience} epochs (patience)"
        if train_cfg.time_budget_s and time.perf_counter() - self.started >= train_cfg.time_budget_s:
            return f"time budget of {train_cfg.time_budget_s:g} s spent"
        return ""

    def result_row(self, interrupted: bool) -> dict:
        """The result: the best epoch's weights back in the model, its efficiency figures (measured only for a
        trial that ran to its end), and the one result row, marked ``interrupted`` after Ctrl-C."""
        model, train_cfg, data, best = self.model, self.train_cfg, self.data, self.best
        model.load_state_dict(best.weights)
        figures = {"params": efficiency.count_parameters(model), "epoch_time_s": float(np.median(self.epoch_times)),
                   "train_throughput": float(np.median(self.throughputs)),
                   "train_energy_j_per_epoch": energy.median_j(self.train_energies),
                   "energy_method": energy.method_of(self.energy)}
        if train_cfg.measure_efficiency and not interrupted:
            figures.update(efficiency.efficiency_figures(self.model_name, self.model_hparams, train_cfg, data, model,
                                                         self.device, self.energy))
        row = make_result(
            model=self.model_name, dataset_meta=data.meta, objective=self.objective, train_cfg=train_cfg,
            model_hparams=model.config.to_dict(),
            best_valid=best.valid, best_test=best.test, best_epoch=best.epoch, epochs_run=self.epochs_run,
            efficiency=figures, device=self.device, extra=model.stats(),
            wall_time_s=time.perf_counter() - self.started,
            popularity={f"pop_{k}": v for k, v in popularity_metrics(data.test, data.item_popularity,
                                                                       negatives=self.negatives.get("test"),
                                                                       mask_history=train_cfg.mask_history).items()
                        if k == SELECTION_METRIC},
        )
        if interrupted:
            row["status"] = "interrupted"
        return row


def _progress_bar(epochs: int, steps_per_epoch: int | None, description: str, enabled: bool):
    """A bar over training steps when their number is known (long epochs visibly move), else over epochs."""
    from tqdm.auto import tqdm

    if steps_per_epoch:
        return tqdm(total=epochs * steps_per_epoch, desc=description, unit="step", disable=not enabled,
                    file=sys.stderr, leave=True, dynamic_ncols=True)
    return tqdm(total=epochs, desc=description, unit="epoch", disable=not enabled, file=sys.stderr, leave=True)
