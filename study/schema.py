"""What a saved record's keys meant when it was written: one schema version, one upgrade path.

Every record the platform writes and reads back later carries :data:`SCHEMA` under :data:`SCHEMA_KEY`: a trial's
record (``trials/<trial_id>.json``) and its row (``trials.parquet``), a training state's identity and a best
model's ``model.json``. A record without the key was written before schemas were stamped (schema 1).

When a key is added to a model's config or to the trainer's settings, what a record that lacks it ran with need
not be today's default: a BERT4Rec trained before ``output_bias`` existed had no bias, while today's default has
one. :data:`ADDED` says, once for every such key, from which schema on records carry it and what the runs before
ran with; :data:`RENAMED` maps keys that were renamed to today's names. :func:`upgrade_settings` is the one upgrade
path: every reader that rebuilds a model, continues a training state or compares settings across records passes
the recorded settings through it first. This module imports neither torch nor pandas.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# 2: records carry `schema`; 3: `cloze_window_step` became `window_step`, for every objective. Every key ADDED at a
# schema is in every record of that schema or later. 4: `sampled_test_negatives`. 5: the learning-rate decay.
# 6: the learning-rate warm-up. 7: the learning-rate schedule became `auto` (a family's validated one on its default
# windows), so a record that lacks one of its keys ran with the constant rate that was every trial's before.
SCHEMA = 7
SCHEMA_KEY = "schema"
UNSTAMPED = 1  # the schema of a record that carries none


@dataclass(frozen=True)
class Added:
    """A key that records of schemas before ``schema`` may lack, and what the runs that wrote them ran with."""

    schema: int
    key: str
    before: Any
    model: str = ""  # the model whose config has the key; "" for a trainer setting (every model)


ADDED = (
    # the paper's output bias; the head before it had none
    Added(2, "output_bias", False, model="bert4rec"),
    # before the setting existed (as cloze_window_step), every objective trained on each user's newest window only
    Added(2, "window_step", 0),
    # before, windows over the whole history were cloze's, which scores every window's masked targets
    Added(3, "window_targets", "all"),
    Added(2, "adam_beta2", 0.999),  # torch's default, which the trainer fixed
    Added(2, "init", "per_matrix", model="lisa"),  # each (W, D) or (D, D) matrix initialised alone
    Added(2, "query_batchnorm", False, model="elastic"),
    Added(2, "key_heads", 1, model="elastic"),
    Added(4, "sampled_test_negatives", 0),  # full-ranking test metrics only
    Added(5, "lr_decay_factor", 0.5),  # read only when lr_decay_patience is set
    # The schedule's keys were added at 5 (the decay) and 6 (the warm-up) and became `auto` at 7; until then every
    # trial that did not set them ran at the constant rate, so 7 covers the records of all three
    Added(7, "lr", 1e-3),
    Added(7, "lr_warmup_steps", 0),  # the full rate from the first step
    Added(7, "lr_decay_patience", 0),  # a constant learning rate
)
# an old key -> today's key, applied before ADDED (whose keys are today's)
RENAMED: dict[str, str] = {"cloze_window_step": "window_step"}


def renamed_hint(key: str) -> str:
    """``"; renamed to NEW"`` for a key that was renamed (for an unknown-key message), else ``""``."""
    return f"; renamed to {RENAMED[key]}" if key in RENAMED else ""


SCOPES = ("model", "trainer", "all")


def schema_of(record: dict[str, Any]) -> int:
    """The schema a record was written under (:data:`UNSTAMPED` when it carries none)."""
    value = record.get(SCHEMA_KEY)
    return UNSTAMPED if value is None else int(value)


def upgrade_settings(model: str, settings: dict[str, Any], schema: int, *, scope: str = "all") -> dict[str, Any]:
    """``settings`` of a record of ``model`` written under ``schema``, as today's keys mean them: renamed keys take
    today's names, and each key added since takes the value the run had. ``scope`` says which keys ``settings``
    holds: ``model`` (a model config), ``trainer`` (trainer settings) or ``all`` (both, as a row's columns).

    A key is filled only where the record lacks it: a record that has it ran with its own value."""
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")
    upgraded = {RENAMED.get(key, key): value for key, value in settings.items()}
    for added in ADDED:
        in_scope = scope == "all" or (scope == "model") == bool(added.model)
        if schema < added.schema and added.model in ("", model) and in_scope and added.key not in upgraded:
            upgraded[added.key] = added.before
    return upgraded


def upgrade_identity(identity: dict[str, Any]) -> dict[str, Any]:
    """A training state's or a best model's identity (:func:`study.train.state.model_identity`) with its model config
    and settings upgraded (:func:`upgrade_settings`), stamped with today's schema."""
    if not identity:
        return identity
    schema, model = schema_of(identity), identity.get("model", "")
    upgraded = dict(identity, **{SCHEMA_KEY: SCHEMA})
    if "model_config" in identity:
        upgraded["model_config"] = upgrade_settings(model, identity["model_config"], schema, scope="model")
    if "settings" in identity:
        upgraded["settings"] = upgrade_settings(model, identity["settings"], schema, scope="trainer")
    return upgraded
