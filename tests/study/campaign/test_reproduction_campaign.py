"""The committed reproduction campaign is a valid campaign, its ablations change only what they name, and its
tracked records are the compact ones the page is regenerated from."""

from __future__ import annotations

from pathlib import Path

import pytest

import models
from study.campaign.runner import RECORD_FILES, finished_seeds
from study.campaign.spec import load_campaign
from study.spec.yaml_io import read_yaml
from study.train.config import split_settings
from study.train.objectives import CONSTANT_SCHEDULE, resolve_auto_settings, resolve_objective

HOME = Path(__file__).resolve().parents[3] / "experiments" / "reproduction"


def test_the_campaign_file_loads_and_each_ablation_table_is_headed_by_its_full_model() -> None:
    campaign = load_campaign(HOME / "campaign.yaml")  # every study it names has a study file
    for model, group in campaign.ablations.items():
        assert group[0] in campaign.studies and group[0].startswith(model.lower())
    assert {c.dataset for c in campaign.claims if c.against_published} == {"lastfm", "beauty"}
    assert all(c.candidate in campaign.all_studies() and (c.against_published or c.reference in
                                                          campaign.all_studies()) for c in campaign.claims)


@pytest.mark.parametrize(("main_study", "ablation", "changes"), [
    ("bert4rec", "bert4rec-last-item-samples", {"cloze_last_item_samples": True}),
    # the whole-history windows, and BERT4Rec's output bias, which this study alone ran again with
    ("bert4rec", "bert4rec-sliding-windows", {"window_step": 5, "output_bias": True}),
    ("cotten4rec", "cotten4rec-sliding-windows", {"window_step": 5}),
    # today's default windows, and SASRec's, GRU4Rec's and FPMC's learning-rate schedule on them
    *[(family, f"{family}-history", {"window_step": 10, "window_targets": "new", "lr": 6e-3, "lr_warmup_steps": 110,
                                     "lr_decay_patience": 3}) for family in ("sasrec", "gru4rec", "fpmc")],
    ("hstu", "hstu-history", {"window_step": 10, "window_targets": "new"}),
    *[(base, ablation, {"window_step": 10, "window_targets": "new"})
      for base, ablation in (("lisa-base-init", "lisa-history"), ("sasrec-1l1h", "sasrec-1l1h-history"))]])
def test_an_ablation_differs_from_its_full_model_by_the_keys_it_names(main_study: str, ablation: str,
                                                                     changes: dict[str, object]) -> None:
    main, _ = read_yaml(HOME / "studies" / f"{main_study}.yaml")
    changed, _ = read_yaml(HOME / "studies" / f"{ablation}.yaml")
    for key, value in changes.items():
        # off: each user's newest window, no samples, no bias, the constant rate
        assert main["fixed"].pop(key, None) in (None, 0, False, CONSTANT_SCHEDULE.get(key, 0))
        assert changed["fixed"].pop(key) == value
    assert changed.pop("name") == f"repro-ml100k-{ablation}"
    main.pop("name")
    assert changed == main


def test_the_tracked_records_hold_only_the_compact_files() -> None:
    folders = list((HOME / "runs").glob("repro-*"))
    assert folders
    for folder in folders:
        assert {p.name for p in folder.iterdir()} <= set(RECORD_FILES), folder
        assert finished_seeds(folder) >= 1, folder


# Each model's campaign study that ran at its defaults, and where the defaults still differ from it, with why.
DEFAULTS_RAN_AS = {
    "sasrec": ("sasrec-history", set()),
    "bert4rec": ("bert4rec-sliding-windows", set()),
    "cotten4rec": ("cotten4rec-sliding-windows", set()),
    "elastic": ("elastic", set()),
    "gru4rec": ("gru4rec-history", set()),
    "fpmc": ("fpmc-history", set()),
    "hstu": ("hstu-history", set()),
    "lisa": ("lisa-history", set()),
    # the causal form, which trains with the causal CE at a fraction of the cost of the paper's bidirectional form
    # (the default), which trains with `last`
    "linrec": ("linrec", {"causal", "objective"}),
    "recgrela": ("recgrela", {"causal", "objective"}),
}


def resolved(model: str, settings: dict) -> dict:
    """``settings`` over the model's and the trainer's defaults, with every `auto` resolved as a trial resolves it."""
    train, hparams = split_settings(model, settings)
    sizes = {"num_items": 10, **({"num_users": 10} if "num_users" in models.config_fields(model) else {})}
    config = models.make_config(model, **sizes, **hparams)
    objective = resolve_objective(models.build(model, **sizes, **hparams), train.objective)
    return {**config.to_dict(), **vars(resolve_auto_settings(train, objective, config.max_len, model)),
            "objective": objective}


@pytest.mark.parametrize("model", sorted(DEFAULTS_RAN_AS))
def test_each_models_defaults_are_the_settings_its_campaign_study_ran(model: str) -> None:
    """What ``python -m study.train --model M`` trains is what the campaign measured for M, except where named."""
    assert set(DEFAULTS_RAN_AS) == set(models.available())
    study, differences = DEFAULTS_RAN_AS[model]
    spec, _ = read_yaml(HOME / "studies" / f"{study}.yaml")
    assert spec["model"] == model
    ran = resolved(model, {**spec["protocol"], **spec["fixed"]})
    default = resolved(model, {})
    changed = {key for key in ran if ran[key] != default[key] and key not in ("seed",)}
    assert changed == differences, {key: (default[key], ran[key]) for key in changed}
