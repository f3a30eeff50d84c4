"""The trainer's settings: :class:`TrainConfig`, and the role of each key, declared once beside it.

A role says what the platform may do with a key, wherever it meets one:

- ``PROTOCOL``: how results are ranked and selected; a study fixes it for all its trials (its ``protocol:``
  section) and every row records it (:func:`study.train.results.protocol_of`).
- ``RANKING``: the part of the protocol that makes two studies' metrics comparable at all (with the dataset).
- ``EXECUTION``: how a trial runs, never what it learns; a sweep sets it from its resources, never searches it.
- ``CONTINUES``: what a continued trial may change: when it stops, where it runs and what it measures, never what
  an epoch computes (:func:`study.train.state.continuation`). ``trim_padding`` follows the device when unset and
  leaves the real items' results as they are, so a trial checkpointed on a GPU node goes on on a CPU node;
  ``compile_mode`` only says how torch.compile launches the same step.
- ``STEP_COST``: changes what one training step costs; a scaling study's ``train:`` section takes these.

A key with no role is an ordinary training setting: it changes what the trial learns. This module imports neither
torch nor the model zoo, so study-file readers and the results layout can read roles cheaply; typing and checking
values against a model is :mod:`study.train.config`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

PROTOCOL, RANKING, EXECUTION, CONTINUES, STEP_COST = "protocol", "ranking", "execution", "continues", "step_cost"
ROLES = (PROTOCOL, RANKING, EXECUTION, CONTINUES, STEP_COST)


def setting(default: Any, *roles: str) -> Any:
    """A :class:`TrainConfig` field with ``default`` and the roles it plays (see the module docstring)."""
    unknown = set(roles) - set(ROLES)
    if unknown:
        raise ValueError(f"unknown roles {sorted(unknown)}; roles are {ROLES}")
    return dataclasses.field(default=default, metadata={"roles": frozenset(roles)})


EVAL_MODES = ("full", "sampled")
WINDOW_TARGETS = ("new", "tail", "aligned", "shifting", "single", "all")
# the window_targets under which an epoch scores each training item once
SCORED_ONCE = ("new", "tail", "aligned", "shifting", "single")
NEGATIVE_SAMPLERS = ("uniform", "popularity")
METRIC_KS = (5, 10, 20)
SELECTION_METRIC = "ndcg@10"  # the default validation metric that picks the best epoch
SELECTABLE_METRICS = tuple(f"{name}@{k}" for name in ("hr", "ndcg", "mrr") for k in METRIC_KS)
PRECISIONS = ("fp32", "bf16", "fp16")
# torch.compile's modes; the two in CUDA_GRAPH_MODES replay the step as CUDA graphs on a GPU
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
AUTO_VALUES = ("auto", "none", "null")  # what leaves an optional setting (default None) to the trainer


@dataclass
class TrainConfig:
    """Trainer and protocol settings, each with its roles (module docstring). Every row records them."""

    # protocol
    objective: str = setting("auto", PROTOCOL, STEP_COST)  # auto = the model's default objective
    eval_mode: str = setting("full", PROTOCOL, RANKING)  # full ranking over all items, or `sampled` negatives
    num_negatives: int = setting(100, PROTOCOL, RANKING)
    negative_sampler: str = setting("uniform", PROTOCOL, RANKING)
    mask_history: bool = setting(False, PROTOCOL, RANKING)  # RecBole's default: history items stay rankable
    # n > 0: besides the protocol's full-ranking test metrics, the best epoch's test metrics against n uniform
    # negatives per user (test_sampled_…), drawn as eval_mode `sampled` draws its test negatives (so the figures
    # equal that protocol's for the same weights): the protocol of papers that report sampled metrics (LISA's 100).
    # Full ranking only, since under `sampled` the test metrics already are sampled. Selection never reads them.
    sampled_test_negatives: int = setting(0, PROTOCOL)
    mask_prob: float = setting(0.2, STEP_COST)  # cloze only; BERT4Rec uses 0.2 on MovieLens, 0.6 on Beauty
    prefixes_per_user: int = 0  # `last` only: 0 = every prefix (RecBole's augmentation), n = n random ones
    # How each user's training history is cut into windows of max_len items, for every objective but `last` (which
    # trains on every prefix): n = windows over the whole history, n items apart, so every training item is a
    # target; 0 = each user's newest window only, which data-parallel workers and streamed datasets need (they hold
    # no whole histories); None (`auto`) = the objective's default. window_targets: which targets of those windows
    # carry the loss, `new` (each item once an epoch, the rest of a window is context), `tail` (the same, with the
    # newest window's older targets scored where they see more context), `aligned` (as `tail`, with every target
    # scored in a window's newest slots, as `last`'s are), `shifting` (as `aligned`, the windows' ends moved by a
    # random number of items below the step every epoch, so a target's slot changes), `single` (`shifting`'s slots,
    # each target in a window of its own, as under `last`) or `all`; None (`auto`) = `new`
    # where an objective scores every position, `all` under cloze. See study.train.objectives.resolve_windows
    window_step: int | None = None
    window_targets: str | None = None
    # `sampled_ce` only (training negatives; num_negatives/negative_sampler above are the *evaluation* protocol's)
    train_negatives: int = 256  # eSASRec's SS-256
    train_negative_sampler: str = "uniform"  # uniform or popularity, always with the logQ correction
    # optimisation
    # The learning-rate schedule: lr, lr_warmup_steps and lr_decay_patience. None (`auto`) = the model family's
    # validated schedule where it trains its default objective on whole-history windows, else a constant LR
    # (study.train.objectives.resolve_schedule)
    lr: float | None = setting(None, STEP_COST)
    weight_decay: float = setting(0.0, STEP_COST)
    # Adam's β₂ (β₁ stays torch's 0.9): torch's 0.999 by default; LISA's authors train with 0.98
    adam_beta2: float = setting(0.999, STEP_COST)
    # Learning-rate decay on a validation plateau: after lr_decay_patience epochs in a row without a better
    # selection_metric, the learning rate is multiplied by lr_decay_factor, and again after as many more (0 = a
    # constant lr). Keyed on validation rather than on a step count because early stopping, not a fixed horizon,
    # decides how long a trial trains; a setting not below `patience` is refused, and an `auto` one resolves to 0 there.
    lr_decay_patience: int | None = None
    lr_decay_factor: float = 0.5
    # Linear warm-up: optimizer step n (from 1) of a trial takes lr × n / lr_warmup_steps until n reaches it, so that
    # a long step does not start while Adam's moment estimates rest on a few batches (0 = none). Counted in steps,
    # as Adam counts them, so a resumed trial goes on warming up where it stopped. It scales the rate in force: a
    # plateau decay during the warm-up lowers the rate it climbs to
    lr_warmup_steps: int | None = None
    batch_size: int = 128
    max_epochs: int = setting(200, CONTINUES)
    # epochs without a better validation score (selection_metric) before stopping (0: never); None (`auto`) =
    # resolve_patience's, by objective
    patience: int | None = setting(None, CONTINUES)
    # the validation metric that picks the best epoch (whose test metrics are reported) and drives early stopping;
    # a published protocol may use another (S3Rec's stops on NDCG@20)
    selection_metric: str = setting(SELECTION_METRIC, PROTOCOL)
    time_budget_s: float = setting(0.0, CONTINUES)  # 0 = no limit; otherwise stop after the epoch that crosses it
    grad_clip: float = 0.0
    seed: int = setting(0, STEP_COST)
    # execution
    device: str = setting("auto", EXECUTION, CONTINUES)  # auto = cuda when available, else cpu
    # 0 = leave torch's default; Ray trials set it to their CPU share
    num_threads: int = setting(0, EXECUTION, CONTINUES)
    eval_batch_size: int = setting(256, EXECUTION, CONTINUES)
    measure_efficiency: bool = setting(True, EXECUTION, CONTINUES)
    # bf16/fp16 autocast of the forward pass and loss (CUDA only: a CPU step stays fp32), and torch.compile of the
    # training loss, network included (anywhere; on a CPU its first step compiles for minutes). Both change the
    # arithmetic, so both are recorded and off by default.
    precision: str = "fp32"
    compile: bool = False
    # torch.compile's mode under `compile`. `reduce-overhead` replays the compiled loss, forward and backward, as
    # CUDA graphs: a few launches where eager issues hundreds, and the zoo's steps on a GPU wait on launches, not
    # arithmetic, so replaying them shortens an epoch several-fold. Only the `last` objective may use it
    # (cuda_graph_conflict says why). A CPU step has no graphs to replay and runs as `default`.
    compile_mode: str = setting("default", CONTINUES)
    # drop the leading columns that are padding in every row of a batch and run its windows in length groups
    # (training, evaluation, latency): the same results at real items, less compute. None (`auto`) trims on a CPU
    # and not on CUDA, where a step at the zoo's sizes waits on kernel launches, not arithmetic, and the groups
    # multiply the launches, so a trimmed step is slower there than a full one
    # (`python -m benchmarks.padding --device cuda` compares them). `auto` does not trim under `compile` either:
    # each trimmed width and length group would be a graph to compile. The row records what ran.
    trim_padding: bool | None = setting(None, CONTINUES)

    def schedule_text(self, steps_per_epoch: int) -> str:
        """The learning-rate schedule, resolved, in words: what a person starting a trial is told."""
        parts = [f"learning rate {self.lr:g}"]
        if self.lr_warmup_steps:
            parts.append(f"warmed up over {self.lr_warmup_steps} steps "
                         f"(~{self.lr_warmup_steps / max(steps_per_epoch, 1):.1f} epochs)")
        if self.lr_decay_patience:
            parts.append(f"x{self.lr_decay_factor:g} after every {self.lr_decay_patience} epochs without a gain")
        return ", ".join(parts) if len(parts) > 1 else f"{parts[0]}, constant"

    def constraint_errors(self) -> list[tuple[str, str]]:
        """Every value out of its range, as ``(key, why)``; the objective's name is checked against the model zoo's
        objectives by :func:`study.train.config.split_settings`."""
        errors = []
        if self.eval_mode not in EVAL_MODES:
            errors.append(("eval_mode", f"must be one of {EVAL_MODES}, got {self.eval_mode!r}"))
        if self.negative_sampler not in NEGATIVE_SAMPLERS:
            errors.append(("negative_sampler", f"must be one of {NEGATIVE_SAMPLERS}, got {self.negative_sampler!r}"))
        if self.train_negative_sampler not in NEGATIVE_SAMPLERS:
            errors.append(("train_negative_sampler",
                           f"must be one of {NEGATIVE_SAMPLERS}, got {self.train_negative_sampler!r}"))
        for key in ("num_negatives", "train_negatives"):
            if getattr(self, key) < 1:
                errors.append((key, f"must be >= 1, got {getattr(self, key)}"))
        if not 0.0 < self.mask_prob < 1.0:
            errors.append(("mask_prob", f"must be in (0, 1), got {self.mask_prob}"))
        for key in ("batch_size", "max_epochs", "eval_batch_size"):
            if getattr(self, key) < 1:
                errors.append((key, f"must be >= 1, got {getattr(self, key)}"))
        if self.sampled_test_negatives and self.eval_mode != "full":
            errors.append(("sampled_test_negatives", "adds sampled test metrics to full ranking; under eval_mode "
                           f"{self.eval_mode!r} the test metrics already are sampled (use num_negatives)"))
        for key in ("prefixes_per_user", "window_step", "patience", "num_threads", "sampled_test_negatives",
                    "lr_decay_patience", "lr_warmup_steps"):
            if (getattr(self, key) or 0) < 0:
                errors.append((key, f"must be >= 0, got {getattr(self, key)}"))
        if self.window_targets not in (None, *WINDOW_TARGETS):
            errors.append(("window_targets", f"must be auto or one of {WINDOW_TARGETS}, got {self.window_targets!r}"))
        if not 0.0 <= self.adam_beta2 < 1.0:  # torch's range; NaN fails it too
            errors.append(("adam_beta2", f"must be in [0, 1), got {self.adam_beta2}"))
        if self.lr is not None and self.lr <= 0:
            errors.append(("lr", f"must be > 0, got {self.lr}"))
        if not 0.0 < self.lr_decay_factor <= 1.0:
            errors.append(("lr_decay_factor", f"must be in (0, 1], got {self.lr_decay_factor}"))
        if self.selection_metric not in SELECTABLE_METRICS:
            errors.append(("selection_metric", f"must be one of {SELECTABLE_METRICS}, got {self.selection_metric!r}"))
        if self.precision not in PRECISIONS:
            errors.append(("precision", f"must be one of {PRECISIONS}, got {self.precision!r}"))
        if self.compile_mode not in COMPILE_MODES:
            errors.append(("compile_mode", f"must be one of {COMPILE_MODES}, got {self.compile_mode!r}"))
        elif self.compile_mode != "default" and not self.compile:
            errors.append(("compile_mode", f"{self.compile_mode!r} needs compile: true (the step runs eager)"))
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            errors.append(("device", f"must be auto, cpu or cuda[:N], got {self.device!r}"))
        return errors


LR = 1e-3  # the constant rate of the `auto` schedule where no family schedule applies (SASRec's paper, RecBole's)
PATIENCE = 10
# A cloze epoch supervises about mask_prob (0.2) of the targets a causal epoch does, so it needs about five times
# the epochs: the reproduction's BERT4Rec studies ran with patience 50 and their best epochs fell at 40-185.
CLOZE_PATIENCE = 50


def resolve_patience(objective: str, patience: int | None) -> int:
    """The patience a trial of ``objective`` (resolved) stops with: the setting, or the objective's default."""
    if patience is not None:
        return patience
    return CLOZE_PATIENCE if objective == "cloze" else PATIENCE


def keys_with(role: str) -> tuple[str, ...]:
    """The :class:`TrainConfig` keys that play ``role``, in declaration order."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; roles are {ROLES}")
    return tuple(f.name for f in dataclasses.fields(TrainConfig) if role in f.metadata.get("roles", ()))
