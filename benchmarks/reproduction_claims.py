"""What ``python -m benchmarks.reproduction`` compares (docs/reproduction.md): its studies, the published claims
and the published table rows.

Each study is a file of ``search_spaces/reproduction/``. Each claim names its source, the two studies it compares
and how it is judged; each published row is a full-ranking result that a study reruns under the same protocol.
"""

from __future__ import annotations

from dataclasses import dataclass

MAIN_STUDIES = ("sasrec", "bert4rec", "gru4rec", "fpmc", "hstu", "linrec", "recgrela", "cotten4rec", "elastic",
                "sasrec-1l1h", "lisa-base", "lisa-soft", "lisa-mini")
# studies that each change one part of a model, shown in a table beside the full model's and its other variants
# (BERT4Rec's "ablations" change its training samples, its regularisation or its budget; the whole-history study
# also has the paper's output bias, which the newest-window studies ran without)
ABLATION_GROUPS = {"ELASTIC": ("elastic", "elastic-mean-query", "elastic-no-imr", "elastic-no-dispatcher"),
                   # SASRec trained with ELASTIC's objective: ELASTIC's comparison with its architecture alone changed
                   "SASRec": ("sasrec", "sasrec-last"),
                   "LISA": ("lisa-base", "lisa-base-w16", "lisa-soft", "lisa-mini"),
                   # the Section 3.6 samples (which positions carry the loss); dropout, budget and the windows it trains
                   # on (its reference code's, over the whole history) change that study
                   "BERT4Rec": ("bert4rec", "bert4rec-last-item-samples", "bert4rec-dropout05", "bert4rec-long",
                                "bert4rec-sliding-windows"),
                   # trained on the same windows as bert4rec-sliding-windows, to test its claim against that study
                   "Cotten4Rec": ("cotten4rec", "cotten4rec-sliding-windows")}
ABLATIONS = tuple(study for group in ABLATION_GROUPS.values() for study in group if study not in MAIN_STUDIES)
EFFICIENT = ("linrec", "recgrela", "cotten4rec", "elastic", "lisa-base", "lisa-soft", "lisa-mini")
# SASRec under the protocol of a published table, compared with that table's row rather than with the other studies
PUBLISHED_STUDIES = ("sasrec-s3rec-bce", "sasrec-s3rec-ce", "sasrec-s3rec-bce-patience50")


@dataclass(frozen=True)
class Claim:
    """One published claim as this report tests it: ``candidate`` against ``reference`` on ``metrics``.

    ``kind``: ``better`` (candidate above reference, paired t-test p < 0.05 after Holm over every claim line),
    ``ratio`` (candidate's mean at least ``bound`` × the reference's), ``within`` (|mean difference| <= ``bound``).
    """

    text: str
    source: str
    candidate: str
    reference: str
    kind: str
    bound: float = 0.0
    metrics: tuple[str, ...] = ("test_ndcg@10",)


CLAIMS = (
    Claim("BERT4Rec reaches at least 0.9x SASRec's NDCG@10 when trained long enough",
          "Klenitskiy & Vasilev, RecSys 2023", "bert4rec", "sasrec", "ratio", 0.9),
    Claim("BERT4Rec trained on its reference code's windows, which cover the whole history, with its paper's "
          "output bias, reaches at least 0.9x SASRec's NDCG@10", "Klenitskiy & Vasilev, RecSys 2023",
          "bert4rec-sliding-windows", "sasrec", "ratio", 0.9),
    Claim("BERT4Rec on its reference code's windows reaches at least 0.9x SASRec trained on the whole history too "
          "(CE at the last position of every prefix)", "Klenitskiy & Vasilev, RecSys 2023",
          "bert4rec-sliding-windows", "sasrec-last", "ratio", 0.9),
    Claim("SASRec outperforms GRU4Rec", "Kang & McAuley, ICDM 2018, Table III", "sasrec", "gru4rec", "better"),
    Claim("SASRec outperforms FPMC", "Kang & McAuley, ICDM 2018, Table III", "sasrec", "fpmc", "better"),
    Claim("HSTU outperforms SASRec", "Zhai et al., ICML 2024 (ML-1M: +7% NDCG@10)", "hstu", "sasrec", "better"),
    Claim("LinRec keeps SASRec's accuracy (at least 0.98x NDCG@10)", "Liu et al., SIGIR 2023", "linrec", "sasrec",
          "ratio", 0.98),
    Claim("RecGRELA outperforms SASRec", "RecGRELA, Table 4 (+0.61% to +4.98% over the best baseline)",
          "recgrela", "sasrec", "better"),
    Claim("Cotten4Rec stays within about 2% of BERT4Rec's NDCG@10 (at least 0.98x)",
          "Cotten4Rec (Beauty; 11% lower on ML-1M)", "cotten4rec", "bert4rec", "ratio", 0.98),
    Claim("Cotten4Rec stays within about 2% of BERT4Rec's NDCG@10 when both train on BERT4Rec's reference-code "
          "windows", "Cotten4Rec (Beauty; 11% lower on ML-1M)", "cotten4rec-sliding-windows",
          "bert4rec-sliding-windows", "ratio", 0.98),
    Claim("ELASTIC outperforms SASRec", "ELASTIC, Table 2 (+2.37% on average over its baselines)", "elastic",
          "sasrec", "better"),
    Claim("ELASTIC outperforms SASRec trained as it is (CE at the last position of every prefix, RecBole's setup)",
          "ELASTIC, Table 2", "elastic", "sasrec-last", "better"),
    Claim("LISA-Base stays within 0.01 of a 1-layer, 1-head Transformer on HR@10 and NDCG@10",
          "Wu et al., WWW 2021, Table 3", "lisa-base", "sasrec-1l1h", "within", 0.01,
          ("test_hr@10", "test_ndcg@10")),
    Claim("LISA-Soft stays within 0.01 of a 1-layer, 1-head Transformer on HR@10 and NDCG@10",
          "Wu et al., WWW 2021, Table 3", "lisa-soft", "sasrec-1l1h", "within", 0.01,
          ("test_hr@10", "test_ndcg@10")),
    Claim("LISA-Mini stays within 0.01 of a 1-layer, 1-head Transformer on HR@10 and NDCG@10",
          "Wu et al., WWW 2021, Table 3", "lisa-mini", "sasrec-1l1h", "within", 0.01,
          ("test_hr@10", "test_ndcg@10")),
    Claim("ELASTIC's hierarchical query network beats the mean query", "ELASTIC, Table 3 (ML-1M: -3.36% with the mean)",
          "elastic", "elastic-mean-query", "better"),
    Claim("ELASTIC's per-user interest retrieval (IMR) beats shared interest tokens",
          "ELASTIC, Table 3 (ML-1M: -2.51% without it)", "elastic", "elastic-no-imr", "better"),
    Claim("ELASTIC's dispatcher aggregation helps",
          "ELASTIC, Table 3 (ML-1M: -3.80% without it; the paper does not define that variant)", "elastic",
          "elastic-no-dispatcher", "better"),
)


@dataclass(frozen=True)
class PublishedRow:
    """A published full-ranking result that ``study`` reruns under the same protocol on ``dataset``.

    ``kind``: ``match`` (our mean NDCG@10 within 5 % of the published one, or above it), ``beat`` (above it), or
    ``diagnostic``: ``study`` departs from the table's protocol as ``change`` says, so it gets no verdict; its ratio to
    the row measures how much of a gap that change explains.
    """

    study: str
    dataset: str
    source: str
    hr10: float
    ndcg10: float
    kind: str
    change: str = ""


S3REC_TABLE = "S3Rec (Zhou et al., CIKM 2020), all-item ranking table, SASRec row"
PUBLISHED = (
    PublishedRow("sasrec-s3rec-bce", "lastfm", S3REC_TABLE, 0.0688, 0.0390, "match"),
    PublishedRow("sasrec-s3rec-bce", "beauty", S3REC_TABLE, 0.0605, 0.0318, "match"),
    PublishedRow("sasrec-s3rec-ce", "lastfm", S3REC_TABLE, 0.0688, 0.0390, "beat"),
    PublishedRow("sasrec-s3rec-ce", "beauty", S3REC_TABLE, 0.0605, 0.0318, "beat"),
    PublishedRow("sasrec-s3rec-bce-patience50", "lastfm", S3REC_TABLE, 0.0688, 0.0390, "diagnostic",
                 "sasrec-s3rec-bce with patience 50 instead of S3Rec's 10"),
)
