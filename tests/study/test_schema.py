"""One schema version on saved records and one upgrade path: a record written before a key existed is read as it
ran, not with today's default, wherever it is read (a rebuilt model, a continued state, a results table)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import models
from models import ConfigError
from study.analysis.runs import upgrade_rows
from study.schema import SCHEMA, SCHEMA_KEY, UNSTAMPED, schema_of, upgrade_identity, upgrade_settings
from study.train.config import split_settings
from study.train.objectives import resolve_auto_settings
from study.train.settings import TrainConfig
from study.train.state import identity_changes, model_identity


def test_a_recorded_config_rebuilds_the_model_that_was_trained_not_todays_default() -> None:
    """A run recorded before BERT4Rec had ``output_bias`` trained without the bias: its record, which lacks the key,
    must rebuild that model so its weights load (exports, ``study.recommend``), while today's default has it."""
    then = models.build("bert4rec", num_items=30, max_len=8, output_bias=False)
    record = {key: value for key, value in then.config.to_dict().items() if key != "output_bias"}
    with pytest.raises(RuntimeError, match="output_bias"):
        models.build("bert4rec", **record).load_state_dict(then.state_dict())
    rebuilt = models.build("bert4rec", **upgrade_settings("bert4rec", record, UNSTAMPED, scope="model"))
    rebuilt.load_state_dict(then.state_dict())
    assert rebuilt.output_bias is None
    # a key the record holds is kept; a model without such keys, and a record of today's schema, are left as recorded
    assert upgrade_settings("bert4rec", {**record, "output_bias": True}, UNSTAMPED)["output_bias"] is True
    assert upgrade_settings("sasrec", {"num_items": 30}, UNSTAMPED, scope="model") == {"num_items": 30}
    assert upgrade_settings("bert4rec", record, SCHEMA) == record


@pytest.mark.parametrize(("model", "recorded", "key", "ran"), [
    ("lisa", {}, "init", "per_matrix"), ("lisa", {"init": "authors"}, "init", "authors"),
    ("elastic", {}, "query_batchnorm", False), ("elastic", {}, "key_heads", 1), ("sasrec", {}, "adam_beta2", 0.999)])
def test_a_record_without_a_later_key_reads_as_it_ran(model: str, recorded: dict, key: str, ran: object) -> None:
    assert upgrade_settings(model, {"num_items": 30, **recorded}, UNSTAMPED)[key] == ran


def test_each_scope_gets_only_its_own_keys() -> None:
    trainer = upgrade_settings("bert4rec", {"lr": 0.001}, UNSTAMPED, scope="trainer")
    assert "output_bias" not in trainer and (trainer["window_step"], trainer["window_targets"]) == (0, "all")
    assert "window_step" not in upgrade_settings("bert4rec", {}, UNSTAMPED, scope="model")


def test_a_sasrec_record_from_before_the_family_schedule_reads_as_the_constant_rate_it_ran() -> None:
    """Before SASRec's windows took a schedule of their own, a study that named no rate trained at a constant 1e-3;
    its record lacks the keys, and must not read as today's `auto` schedule."""
    def schedule(settings: dict) -> tuple:
        train, _ = split_settings("sasrec", settings)
        ran = resolve_auto_settings(train, "causal", 50, "sasrec")
        return ran.lr, ran.lr_warmup_steps, ran.lr_decay_patience

    recorded = {"window_step": 10, "seed": 3}
    assert schedule(upgrade_settings("sasrec", recorded, 6)) == (1e-3, 0, 0)
    assert schedule(upgrade_settings("sasrec", recorded, SCHEMA)) == (6e-3, 110, 3)


def test_a_renamed_key_reads_as_todays_and_study_files_name_the_new_one() -> None:
    assert upgrade_settings("bert4rec", {"cloze_window_step": 5}, 2) == {"window_step": 5, "window_targets": "all",
                                                                         "lr": 0.001,
                                                                         "sampled_test_negatives": 0,
                                                                         "lr_decay_patience": 0,
                                                                         "lr_decay_factor": 0.5,
                                                                         "lr_warmup_steps": 0}
    with pytest.raises(ConfigError, match="renamed to window_step"):
        split_settings("bert4rec", {"cloze_window_step": 5})
    with pytest.raises(ValueError, match="scope"):
        upgrade_settings("sasrec", {}, UNSTAMPED, scope="trainr")


def test_a_state_from_before_a_setting_continues_only_where_it_trained_the_same() -> None:
    settings = vars(TrainConfig(objective="cloze", window_step=0, window_targets="all"))  # as the trainer records
    current = model_identity("bert4rec", {"max_len": 8, "output_bias": False}, settings, {"content_hash": "h"})
    assert schema_of(current) == SCHEMA
    old = {key: value for key, value in current.items() if key != SCHEMA_KEY}
    old = {**old, "model_config": {"max_len": 8}, "settings": {k: v for k, v in settings.items()
                                                                if k not in ("window_step", "window_targets")}}
    assert schema_of(old) == UNSTAMPED and upgrade_identity(old)[SCHEMA_KEY] == SCHEMA
    assert identity_changes(old, current) == []  # it trained on the newest window and without a bias, as now
    windows = model_identity("bert4rec", {"max_len": 8, "output_bias": False},
                             {**settings, "window_step": 5}, {"content_hash": "h"})
    assert identity_changes(old, windows) == ["window_step: 0 -> 5"]


def test_rows_of_an_earlier_schema_compare_with_todays() -> None:
    today = {"lr": 0.001, "window_step": 0, "window_targets": "all", "output_bias": False, "adam_beta2": 0.999,
             "sampled_test_negatives": 0, "lr_decay_patience": 0, "lr_decay_factor": 0.5, "lr_warmup_steps": 0}
    rows = pd.DataFrame({"model": ["bert4rec", "bert4rec"], SCHEMA_KEY: [None, SCHEMA],
                         "config": [json.dumps({"lr": 0.001}), json.dumps(today, sort_keys=True)]})
    upgraded = upgrade_rows(rows)
    assert [json.loads(c) for c in upgraded["config"]] == [today, today]
    assert upgrade_rows(rows.drop(columns=[SCHEMA_KEY]))["config"].iloc[0] == json.dumps(today, sort_keys=True)
