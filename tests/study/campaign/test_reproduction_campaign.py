"""The committed reproduction campaign is a valid campaign, its ablations change only what they name, and its
tracked records are the compact ones the page is regenerated from."""

from __future__ import annotations

from pathlib import Path

import pytest

from study.campaign.runner import RECORD_FILES, finished_seeds
from study.campaign.spec import load_campaign
from study.spec.yaml_io import read_yaml

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
    ("bert4rec", "bert4rec-sliding-windows", {"cloze_window_step": 5, "output_bias": True}),
    ("cotten4rec", "cotten4rec-sliding-windows", {"cloze_window_step": 5})])
def test_an_ablation_differs_from_its_full_model_by_the_keys_it_names(main_study: str, ablation: str,
                                                                     changes: dict[str, object]) -> None:
    main, _ = read_yaml(HOME / "studies" / f"{main_study}.yaml")
    changed, _ = read_yaml(HOME / "studies" / f"{ablation}.yaml")
    for key, value in changes.items():
        assert not main["fixed"].pop(key, None)  # off: each user's newest window, no samples, no bias
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
