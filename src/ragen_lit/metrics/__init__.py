"""Template-collapse diagnostics: cross-scoring (model → score matrices) and the MI proxy metrics."""

from ragen_lit.metrics.cross_scoring import cross_score, cross_score_scopes, gather_prompts
from ragen_lit.metrics.mi import (
    ConditionalEntropy,
    MIDiagnostics,
    MIEstimate,
    MIRecallAtK,
    MIRetrievalAcc,
    MISeqEstimate,
    MIZScore,
    MIZScoreEMA,
    ReasoningEntropy,
    matched_and_marginal,
    recall_chance,
    retrieval_chance,
    retrieval_hits,
    score_row_sums,
)

__all__ = [
    "ConditionalEntropy",
    "MIDiagnostics",
    "MIEstimate",
    "MIRecallAtK",
    "MIRetrievalAcc",
    "MISeqEstimate",
    "MIZScore",
    "MIZScoreEMA",
    "ReasoningEntropy",
    "cross_score",
    "cross_score_scopes",
    "gather_prompts",
    "matched_and_marginal",
    "recall_chance",
    "retrieval_chance",
    "retrieval_hits",
    "score_row_sums",
]
