"""The campaign file (schema: ``docs/campaigns.md``): studies × datasets × seeds, and the claims to check.

:func:`load_campaign` reads it with the study files' YAML toolkit and reports every problem at once as
``file:line: dotted.key: message``. Paths in the file are relative to the file's folder, except dataset sources,
which are relative to the data root (``--data-root`` or ``$SEQREC_DATA_ROOT``): the data is not part of the campaign.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from study.analysis.claims import CAMPAIGN_KINDS, PUBLISHED_KINDS, ROLES, Claim
from study.errors import UserError
from study.spec.yaml_io import NAME_PATTERN, ConfigErrors, StudyConfigError, is_number, read_yaml

DATA_ROOT_ENV = "SEQREC_DATA_ROOT"
TOP_LEVEL = ("name", "prefix", "seeds", "epoch_limit", "metrics", "reference", "study_files", "records", "page",
             "reports", "studies", "ablations", "datasets", "claims")
DATASET_KEYS = ("recipe", "source", "download", "studies", "choose")
CHOOSE_KEYS = ("count", "from", "metric", "ratio_to", "over")
CLAIM_KEYS = ("text", "source", "candidate", "reference", "kind", "bound", "metrics", "dataset", "published",
              "paper_effect", "role")
DEFAULT_METRICS = ("test_hr@10", "test_ndcg@10", "test_mrr@10")


@dataclass(frozen=True)
class Choice:
    """Studies picked from results: the ``count`` of ``candidates`` with the best mean ``metric`` ratio to
    ``ratio_to``, averaged over the datasets ``over``; none until every candidate has every seed on each of them."""

    count: int
    candidates: tuple[str, ...]
    metric: str
    ratio_to: str
    over: tuple[str, ...]


@dataclass(frozen=True)
class Dataset:
    """One dataset of the campaign: the data recipe its studies prepare, where its file is, and what runs on it."""

    key: str
    recipe: str
    source: str | None  # relative to the data root; None: the recipe downloads it
    download: bool  # whether the recipe can fetch the data itself when no data root is given
    studies: tuple[str, ...]  # compared studies, in the report's order (published-row studies are added)
    choose: Choice | None = None


@dataclass
class Campaign:
    """A resolved campaign file; every path is absolute."""

    name: str
    prefix: str
    seeds: int
    epoch_limit: int
    metrics: tuple[str, ...]
    reference: str
    study_files: Path
    records: Path
    page: Path
    reports: Path
    studies: tuple[str, ...]  # the main table, in its order
    ablations: dict[str, tuple[str, ...]]  # a table per model: its full model first, then its variants
    datasets: dict[str, Dataset]
    claims: tuple[Claim, ...]
    source: Path = field(default=Path("campaign.yaml"))

    @property
    def ablation_studies(self) -> tuple[str, ...]:
        """The studies shown only in an ablation table (not in the main one)."""
        return tuple(s for group in self.ablations.values() for s in group if s not in self.studies)

    @property
    def published_studies(self) -> tuple[str, ...]:
        """Studies set against a published row, not against the other studies; in the claims' order."""
        return tuple(dict.fromkeys(c.candidate for c in self.claims if c.against_published))

    def all_studies(self) -> tuple[str, ...]:
        """Every study of the campaign, in the order it runs by default."""
        chosen = [s for d in self.datasets.values() if d.choose for s in d.choose.candidates]
        listed = [*self.studies, *self.ablation_studies, *(s for d in self.datasets.values() for s in d.studies),
                  *chosen, *self.published_studies]
        return tuple(dict.fromkeys(listed))

    def study_file(self, study: str) -> Path:
        return self.study_files / f"{study}.yaml"

    def study_name(self, dataset: str, study: str, quick: bool = False) -> str:
        """The results folder of ``study`` on ``dataset``: ``<prefix>-[quick-]<dataset without dashes>-<study>``."""
        return f"{self.prefix}-{'quick-' if quick else ''}{dataset.replace('-', '')}-{study}"

    def published_on(self, dataset: str) -> tuple[str, ...]:
        """The published-row studies that have a row on ``dataset``."""
        return tuple(s for s in self.published_studies
                     if any(c.candidate == s and c.dataset == dataset for c in self.claims))


def data_root(flag: str | None) -> Path | None:
    """The folder dataset sources are relative to: the flag, else ``$SEQREC_DATA_ROOT``, else none."""
    value = flag or os.environ.get(DATA_ROOT_ENV)
    return Path(value).expanduser() if value else None


def load_campaign(path: Path) -> Campaign:
    """Read and check a campaign file; raises :class:`StudyConfigError` with every problem found."""
    if not path.is_file():
        raise UserError(f"{path}: no such campaign file")
    data, lines = read_yaml(path)
    errors = ConfigErrors(path, lines, set())
    for unknown in (k for k in data if k not in TOP_LEVEL):
        errors.add((unknown,), f"unknown key; a campaign takes {', '.join(TOP_LEVEL)}")
    home = path.resolve().parent
    name = _text(data, ("name",), errors, required=True)
    if name and not NAME_PATTERN.match(name):
        errors.add(("name",), "letters, digits, '.', '_' and '-' only (it names folders)")
    studies = _names(data.get("studies"), ("studies",), errors, required=True)
    ablations = _ablations(data.get("ablations") or {}, errors)
    campaign = Campaign(
        name=name, prefix=_text(data, ("prefix",), errors) or name, seeds=_count(data, "seeds", 5, errors),
        epoch_limit=_count(data, "epoch_limit", 200, errors),
        metrics=_names(data.get("metrics"), ("metrics",), errors) or DEFAULT_METRICS,
        reference=_text(data, ("reference",), errors) or (studies[0] if studies else ""),
        study_files=home / (_text(data, ("study_files",), errors) or "."),
        records=home / (_text(data, ("records",), errors) or "runs"),
        page=home / (_text(data, ("page",), errors) or "README.md"),
        reports=home / (_text(data, ("reports",), errors) or "reports"),
        studies=studies, ablations=ablations, datasets={}, claims=(), source=path)
    default = (*studies, *campaign.ablation_studies)
    campaign.datasets = _datasets(data.get("datasets"), default, errors)
    campaign.claims = tuple(_claim(item, ("claims", i), errors) for i, item in enumerate(data.get("claims") or []))
    _check_references(campaign, errors)
    if errors.items:
        raise StudyConfigError(errors.items)
    return campaign


def _text(data: dict, path: tuple, errors: ConfigErrors, required: bool = False) -> str:
    value = data.get(path[-1])
    if value is None:
        if required:
            errors.add(path, "required")
        return ""
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        errors.add(path, f"expected a string, got {type(value).__name__} {value!r}")
        return ""
    return str(value)


def _count(data: dict, key: str, default: int, errors: ConfigErrors) -> int:
    value = data.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        errors.add((key,), f"expected a positive integer, got {value!r}")
        return default
    return value


def _names(value: Any, path: tuple, errors: ConfigErrors, required: bool = False) -> tuple[str, ...]:
    if value is None:
        if required:
            errors.add(path, "required: a list of names")
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        errors.add(path, f"expected a list of names, got {value!r}")
        return ()
    for index, item in enumerate(value):
        if value.index(item) != index:
            errors.add(path + (index,), f"{item} is listed twice")
    return tuple(value)


def _ablations(value: Any, errors: ConfigErrors) -> dict[str, tuple[str, ...]]:
    if not isinstance(value, dict):
        errors.add(("ablations",), "expected a mapping of a table's title to its studies (full model first)")
        return {}
    return {str(title): _names(studies, ("ablations", title), errors, required=True)
            for title, studies in value.items()}


def _datasets(value: Any, default: tuple[str, ...], errors: ConfigErrors) -> dict[str, Dataset]:
    if not isinstance(value, dict) or not value:
        errors.add(("datasets",), "required: a mapping of dataset keys to their recipe, source and studies")
        return {}
    datasets = {}
    for key, section in value.items():
        where = ("datasets", key)
        if not isinstance(section, dict):
            errors.add(where, f"expected a mapping, got {section!r}")
            continue
        for unknown in (k for k in section if k not in DATASET_KEYS):
            errors.add(where + (unknown,), f"unknown key; a dataset takes {', '.join(DATASET_KEYS)}")
        studies = _names(section.get("studies"), where + ("studies",), errors) or default
        choose = _choice(section["choose"], where + ("choose",), errors) if section.get("choose") else None
        datasets[str(key)] = Dataset(
            key=str(key), recipe=_text(section, where + ("recipe",), errors) or str(key),
            source=_text(section, where + ("source",), errors) or None,
            download=bool(section.get("download", False)), studies=studies, choose=choose)
    return datasets


def _choice(section: Any, where: tuple, errors: ConfigErrors) -> Choice | None:
    if not isinstance(section, dict):
        errors.add(where, f"expected a mapping with {', '.join(CHOOSE_KEYS)}")
        return None
    for unknown in (k for k in section if k not in CHOOSE_KEYS):
        errors.add(where + (unknown,), f"unknown key; choose takes {', '.join(CHOOSE_KEYS)}")
    count = section.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        errors.add(where + ("count",), f"expected a positive integer, got {count!r}")
    return Choice(count=count if isinstance(count, int) else 1,
                  candidates=_names(section.get("from"), where + ("from",), errors, required=True),
                  metric=_text(section, where + ("metric",), errors) or "test_ndcg@10",
                  ratio_to=_text(section, where + ("ratio_to",), errors, required=True),
                  over=_names(section.get("over"), where + ("over",), errors, required=True))


def _claim(item: Any, where: tuple, errors: ConfigErrors) -> Claim:
    if not isinstance(item, dict):
        errors.add(where, f"expected a mapping with {', '.join(CLAIM_KEYS)}")
        return Claim("", "", "", "ratio")
    for unknown in (k for k in item if k not in CLAIM_KEYS):
        errors.add(where + (unknown,), f"unknown key; a claim takes {', '.join(CLAIM_KEYS)}")
    kind = _text(item, where + ("kind",), errors, required=True)
    if kind and kind not in CAMPAIGN_KINDS:
        errors.add(where + ("kind",), f"unknown kind {kind!r}; one of {', '.join(CAMPAIGN_KINDS)}")
    bound = item.get("bound", 0.0)
    if not is_number(bound):
        errors.add(where + ("bound",), f"expected a number, got {bound!r}")
        bound = 0.0
    published = item.get("published") or {}
    if kind in PUBLISHED_KINDS:
        _text(item, where + ("dataset",), errors, required=True)
        if not isinstance(published, dict) or not published or not all(map(is_number, published.values())):
            errors.add(where + ("published",), "required: the row's values, a mapping of metric to number")
            published = {}
    else:
        _text(item, where + ("reference",), errors, required=True)
    metrics = _names(item.get("metrics"), where + ("metrics",), errors) or ("test_ndcg@10",)
    if published and metrics[0] not in published:
        errors.add(where + ("metrics",), f"{metrics[0]} (the judged metric) has no published value")
    paper_effect, role = _paper_effect(item, kind, where, errors), _text(item, where + ("role",), errors)
    if role and role not in ROLES:
        errors.add(where + ("role",), f"unknown role {role!r}; one of {', '.join(ROLES)}")
    return Claim(text=_text(item, where + ("text",), errors, required=True),
                 source=_text(item, where + ("source",), errors, required=True),
                 candidate=_text(item, where + ("candidate",), errors, required=True), kind=kind,
                 reference=_text(item, where + ("reference",), errors), bound=float(bound), metrics=metrics,
                 dataset=_text(item, where + ("dataset",), errors),
                 published=tuple((str(m), float(v)) for m, v in published.items()), paper_effect=paper_effect,
                 role=role if role in ROLES else "")


def _paper_effect(item: dict, kind: str, where: tuple, errors: ConfigErrors) -> float | None:
    """The paper's relative effect (candidate / reference − 1 at its numbers), for a claim against a study."""
    value = item.get("paper_effect")
    if value is None:
        return None
    if not is_number(value):
        errors.add(where + ("paper_effect",), f"expected a number (e.g. 0.07 for +7 %), got {value!r}")
        return None
    if kind in PUBLISHED_KINDS:
        errors.add(where + ("paper_effect",), "a published row's claim has no paper effect: the row is the paper's")
        return None
    return float(value)


def _check_references(campaign: Campaign, errors: ConfigErrors) -> None:
    """Every study a dataset, claim or choice names has a study file; every dataset a claim names exists."""
    for study in campaign.all_studies():
        if not campaign.study_file(study).is_file():
            errors.add(("studies",), f"{study}: no study file {campaign.study_file(study)}")
    for index, claim in enumerate(campaign.claims):
        if claim.dataset and claim.dataset not in campaign.datasets:
            errors.add(("claims", index, "dataset"), f"unknown dataset {claim.dataset!r}")
    if campaign.reference and campaign.reference not in campaign.studies:
        errors.add(("reference",), f"{campaign.reference} is not one of studies")
