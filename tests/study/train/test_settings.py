"""Each trainer key's role is declared once, beside the key (study.train.settings), and every list of keys the
platform checks against is read from those declarations."""

from __future__ import annotations

import subprocess
import sys

import pytest

from study.analysis.runs import COMPARABILITY_KEYS
from study.spec.scaling_file import TRAIN_KEYS
from study.spec.study_file import EXECUTION_KEYS
from study.train.results import PROTOCOL_SETTINGS, protocol_of
from study.train.settings import (
    CONTINUES,
    EXECUTION,
    PROTOCOL,
    RANKING,
    STEP_COST,
    TrainConfig,
    keys_with,
    setting,
)
from study.train.state import CONTINUATION_KEYS


def test_every_list_of_keys_is_read_from_the_roles() -> None:
    assert PROTOCOL_SETTINGS == keys_with(PROTOCOL)
    assert EXECUTION_KEYS == keys_with(EXECUTION)
    assert CONTINUATION_KEYS == keys_with(CONTINUES)
    assert TRAIN_KEYS == keys_with(STEP_COST)
    assert COMPARABILITY_KEYS == ("dataset", "dataset_hash", *keys_with(RANKING))


def test_the_roles_nest_as_their_meanings_say() -> None:
    assert set(keys_with(RANKING)) < set(keys_with(PROTOCOL))  # ranking is part of the protocol
    assert set(keys_with(EXECUTION)) <= set(keys_with(CONTINUES))  # a continued trial may move to another node
    assert not set(keys_with(CONTINUES)) & set(keys_with(PROTOCOL))  # a continued trial keeps its protocol
    assert not set(keys_with(CONTINUES)) & set(keys_with(STEP_COST))  # and what its steps compute


def test_every_row_records_exactly_the_protocol_keys() -> None:
    assert tuple(protocol_of(TrainConfig(eval_mode="sampled"), "causal")) == keys_with(PROTOCOL)


def test_an_unknown_role_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown role"):
        keys_with("protocl")
    with pytest.raises(ValueError, match="unknown roles"):
        setting(1, "protocl")


def test_the_roles_load_without_torch() -> None:
    # study-file readers and the results layout read roles; torch alone takes seconds to import
    probe = "import sys, study.train.settings, study.spec.scaling_file; print('torch' in sys.modules)"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "False"


def test_a_trial_is_told_its_schedule_in_words() -> None:
    warmed = TrainConfig(lr=6e-3, lr_warmup_steps=110, lr_decay_patience=3)
    assert warmed.schedule_text(55) == ("learning rate 0.006, warmed up over 110 steps (~2.0 epochs), x0.5 after "
                                        "every 3 epochs without a gain")
    constant = TrainConfig(lr=1e-3, lr_warmup_steps=0, lr_decay_patience=0)
    assert constant.schedule_text(8) == "learning rate 0.001, constant"
