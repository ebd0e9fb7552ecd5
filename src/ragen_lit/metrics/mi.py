"""Template-collapse diagnostics: the MI proxy family of RAGEN-2 (docs/METHOD.md §3) as torchmetrics.

Every metric takes rows of a cross-scoring matrix (`cross_scoring.cross_score`):
`scores: [R, N] float` (row r = reasoning z_r scored under each of N prompts; per-token mean
log-prob L_tok for every proxy except MI-Seq-Est, which takes the per-sequence sum L_sum),
`target: [R] long` (r's true column) and optionally `column_groups: [N] long` (columns with equal
group ids hold the same prompt; retrieval counts a hit on any of them, as in the reference).

With matched_r = L[r, target_r] and marginal_r = logsumexp_j L[r, j] − log N:
  MI-Est = mean(matched) − mean(marginal) = H(Z) − H(Z|X), with H(Z|X) = −mean(matched) and
  H(Z) = −mean(marginal); MI-ZScore = mean_r (matched_r − marginal_r) / (std(marginal) + 1e-3)
  (population std over all rows); Retrieval-Acc / Recall@k: true column (or an equivalent one)
  among the k highest-scoring columns of the row.

Ties: columns are ranked by score, then by column index (lowest first), i.e. torch.argmax's
first-maximum rule for k = 1, deterministic for every k.

States are float64 sums reduced with `dist_reduce_fx="sum"`, so `update` on any split of the rows
over ranks or calls gives the same `compute()` as one `update` with all rows. Only the EMA of the
marginal std (MI-ZScore-EMA) is not a sum: it is a buffer that each `compute()` folds the global
std into (identically on every rank), that `reset()` keeps and that `state_dict()` saves.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torchmetrics import Metric

STD_EPS = 1e-3
RECALL_KS = (2, 4, 8)
_ROW_COUNTS = ("num_rows", "num_columns_sum", "log_num_columns_sum")
_LOGPROB_SUMS = ("matched_sum", "marginal_sum", "marginal_sq_sum")


def check_score_rows(
    scores: Tensor, target: Tensor, column_groups: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Validate one update's inputs: returns scores [R, N] float64, target [R] long, column_groups [N] long.

    Without `column_groups` every column is its own group."""
    if scores.dim() != 2 or scores.shape[1] == 0:
        raise ValueError(f"scores must be [R, N] with N >= 1 columns, got shape {tuple(scores.shape)}")
    if not scores.is_floating_point():
        raise ValueError(f"scores must be a float tensor, got {scores.dtype}")
    if not torch.isfinite(scores).all():
        raise ValueError("scores must be finite (log-probabilities), got NaN or inf")
    num_rows, num_columns = scores.shape
    if target.shape != (num_rows,) or target.is_floating_point() or target.dtype == torch.bool:
        raise ValueError(
            f"target must be a [R] = [{num_rows}] integer tensor, got {target.dtype} {tuple(target.shape)}"
        )
    if num_rows and not ((target >= 0).all() and (target < num_columns).all()):
        raise ValueError(f"target holds column indices outside [0, {num_columns}): {target.tolist()}")
    if column_groups is None:
        column_groups = torch.arange(num_columns, device=scores.device)
    elif column_groups.shape != (num_columns,) or column_groups.is_floating_point():
        raise ValueError(
            f"column_groups must be a [N] = [{num_columns}] integer tensor, "
            f"got {column_groups.dtype} {tuple(column_groups.shape)}"
        )
    return scores.double(), target.long().to(scores.device), column_groups.long().to(scores.device)


def matched_and_marginal(scores: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """Row-wise matched and marginal log-probabilities (docs/METHOD.md §3).

    Args: scores [R, N] float, target [R] long.
    Returns: matched [R] = scores[r, target_r]; marginal [R] = logsumexp_j scores[r, j] − log N
    (log of the uniform prompt mixture p(z) = (1/N) Σ_j p(z | x_j)).
    """
    matched = scores.gather(1, target[:, None]).squeeze(1)
    marginal = scores.logsumexp(1) - math.log(scores.shape[1])
    return matched, marginal


def equivalent_columns(target: Tensor, column_groups: Tensor) -> Tensor:
    """[R, N] bool: column j holds the same prompt as row r's true column."""
    return column_groups[None, :] == column_groups[target][:, None]


def retrieval_hits(scores: Tensor, target: Tensor, k: int = 1, column_groups: Tensor | None = None) -> Tensor:
    """[R] bool: a column equivalent to target_r is among the k_eff = min(k, N) top-ranked columns.

    Ranking is by score descending, ties broken by the lower column index (argmax's first maximum)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    scores, target, column_groups = check_score_rows(scores, target, column_groups)
    ranking = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, : min(k, scores.shape[1])]
    return equivalent_columns(target, column_groups).gather(1, ranking).any(1)


def row_chance(target: Tensor, column_groups: Tensor | None = None, num_columns: int | None = None) -> Tensor:
    """[R] float64: chance that a uniformly random column is equivalent to row r's true column,
    count(columns equivalent to target_r) / N. Give `column_groups` [N] long or `num_columns` N."""
    num_columns = _num_columns(column_groups, num_columns)
    if column_groups is None:
        return torch.full(target.shape, 1.0 / num_columns, dtype=torch.float64, device=target.device)
    counts = equivalent_columns(target.long(), column_groups.long().to(target.device)).sum(1)
    return counts.double() / num_columns


def retrieval_chance(target: Tensor, column_groups: Tensor | None = None, num_columns: int | None = None) -> Tensor:
    """Chance level of Retrieval-Acc, 0-dim float64: mean_r count(columns equivalent to target_r) / N
    (1/N without duplicate prompts)."""
    return row_chance(target, column_groups, num_columns).mean()


def recall_chance(
    target: Tensor, k: int, column_groups: Tensor | None = None, num_columns: int | None = None
) -> Tensor:
    """Chance level of Recall@k as the reference computes it, 0-dim float64:
    min(1, retrieval_chance · k_eff) with k_eff = min(k, N)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    num_columns = _num_columns(column_groups, num_columns)
    return (retrieval_chance(target, column_groups, num_columns) * min(k, num_columns)).clamp(max=1.0)


def _num_columns(column_groups: Tensor | None, num_columns: int | None) -> int:
    if column_groups is None:
        if num_columns is None or num_columns < 1:
            raise ValueError(f"num_columns must be >= 1 when column_groups is not given, got {num_columns}")
        return num_columns
    if num_columns is not None and num_columns != column_groups.numel():
        raise ValueError(f"num_columns={num_columns} disagrees with column_groups of length {column_groups.numel()}")
    return column_groups.numel()


def score_row_sums(
    scores: Tensor, target: Tensor, column_groups: Tensor | None = None, ks: tuple[int, ...] = ()
) -> dict[str, Tensor]:
    """The float64 sums over one update's rows from which every proxy is computed.

    Keys: `num_rows`, `num_columns_sum` (Σ_r N), `log_num_columns_sum` (Σ_r log N), `matched_sum`,
    `marginal_sum`, `marginal_sq_sum`, and per k in `ks`: `hits_top{k}` and `chance_top{k}_sum`
    (Σ_r chance_r · min(k, N)).
    """
    scores, target, column_groups = check_score_rows(scores, target, column_groups)
    num_rows, num_columns = scores.shape
    matched, marginal = matched_and_marginal(scores, target)
    sums = {
        "num_rows": scores.new_tensor(float(num_rows)),
        "num_columns_sum": scores.new_tensor(float(num_rows * num_columns)),
        "log_num_columns_sum": scores.new_tensor(num_rows * math.log(num_columns)),
        "matched_sum": matched.sum(),
        "marginal_sum": marginal.sum(),
        "marginal_sq_sum": marginal.square().sum(),
    }
    if ks:
        chance = row_chance(target, column_groups).sum()
        ranking = torch.sort(scores, dim=1, descending=True, stable=True).indices
        equivalent = equivalent_columns(target, column_groups).gather(1, ranking)  # [R, N] in rank order
        for k in ks:
            k_eff = min(k, num_columns)
            sums[f"hits_top{k}"] = equivalent[:, :k_eff].any(1).double().sum()
            sums[f"chance_top{k}_sum"] = chance * k_eff
    return sums


def retrieval_state_names(ks: tuple[int, ...]) -> list[str]:
    """Names of the retrieval sums `score_row_sums` returns for these k."""
    return [name for k in ks for name in (f"hits_top{k}", f"chance_top{k}_sum")]


def marginal_std(sums: dict[str, Tensor]) -> Tensor:
    """Population std of marginal_r over all rows, from the sums (clamped at 0 against rounding)."""
    mean = sums["marginal_sum"] / sums["num_rows"]
    return (sums["marginal_sq_sum"] / sums["num_rows"] - mean.square()).clamp(min=0).sqrt()


def mi_estimate(sums: dict[str, Tensor]) -> Tensor:
    """MI-Est = mean(matched) − mean(marginal)."""
    return sums["matched_sum"] / sums["num_rows"] - sums["marginal_sum"] / sums["num_rows"]


def next_ema(ema: Tensor, value: Tensor, decay: float) -> Tensor:
    """One EMA step: `value` if `ema` is NaN (first call), else decay·ema + (1−decay)·value.

    A NaN `value` (a compute without rows) leaves the EMA as it is."""
    if torch.isnan(value):
        return ema.clone()
    return value.clone() if torch.isnan(ema) else decay * ema + (1 - decay) * value


class _ScoreRowsMetric(Metric):
    """Accumulates `score_row_sums` of every update in float64 sum states."""

    is_differentiable = False
    full_state_update = False
    recall_ks: tuple[int, ...] = ()

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        for name in (*_ROW_COUNTS, *_LOGPROB_SUMS, *retrieval_state_names(self.recall_ks)):
            self.add_state(name, torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, scores: Tensor, target: Tensor, column_groups: Tensor | None = None) -> None:
        """Add rows: scores [R, N] float, target [R] long, column_groups [N] long (optional)."""
        for name, value in score_row_sums(scores, target, column_groups, self.recall_ks).items():
            setattr(self, name, getattr(self, name) + value.to(self.device))

    def _sums(self) -> dict[str, Tensor]:
        return {name: getattr(self, name) for name in self._defaults}


class _FoldsEMAOnCompute(Metric):
    """Mixin for metrics holding an EMA buffer: only `compute()` folds it.

    `forward()`'s batch value uses the EMA the batch would give without storing it, because under
    DDP that batch value is rank-local and folding it would make the ranks' EMAs diverge."""

    _in_forward = False

    def forward(self, *args, **kwargs):
        self._in_forward = True
        try:
            return super().forward(*args, **kwargs)
        finally:
            self._in_forward = False

    def _fold(self, ema: Tensor, value: Tensor) -> Tensor:
        folded = next_ema(ema, value, self.decay)
        return folded if self._in_forward else ema.copy_(folded)


class MIRetrievalAcc(_ScoreRowsMetric):
    """Retrieval-Acc: fraction of rows whose highest-scoring column (per-token L) is the true prompt."""

    higher_is_better = True
    recall_ks = (1,)

    def compute(self) -> Tensor:
        return self.hits_top1 / self.num_rows


class MIRecallAtK(_ScoreRowsMetric):
    """Recall@k: fraction of rows whose true prompt is among the min(k, N) highest-scoring columns."""

    higher_is_better = True

    def __init__(self, k: int, **kwargs) -> None:
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        self.recall_ks = (k,)
        super().__init__(**kwargs)

    def compute(self) -> Tensor:
        return getattr(self, f"hits_top{self.recall_ks[0]}") / self.num_rows


class MIEstimate(_ScoreRowsMetric):
    """MI-Est = mean(matched) − mean(marginal) on per-token scores L_tok (0 under collapse, ≤ log N)."""

    higher_is_better = True

    def compute(self) -> Tensor:
        return mi_estimate(self._sums())


class MISeqEstimate(MIEstimate):
    """MI-Seq-Est: MI-Est on per-sequence scores L_sum (pass L_sum as `scores`)."""


class ConditionalEntropy(_ScoreRowsMetric):
    """H(Z|X) estimate = −mean(matched)."""

    higher_is_better = None

    def compute(self) -> Tensor:
        return -self.matched_sum / self.num_rows


class ReasoningEntropy(_ScoreRowsMetric):
    """H(Z) estimate = −mean(marginal)."""

    higher_is_better = None

    def compute(self) -> Tensor:
        return -self.marginal_sum / self.num_rows


class MIZScore(_ScoreRowsMetric):
    """MI-ZScore = mean_r (matched_r − marginal_r) / (population std of marginal + std_eps)."""

    higher_is_better = True

    def __init__(self, std_eps: float = STD_EPS, **kwargs) -> None:
        super().__init__(**kwargs)
        self.std_eps = std_eps

    def compute(self) -> Tensor:
        sums = self._sums()
        return mi_estimate(sums) / (marginal_std(sums) + self.std_eps)


class MIZScoreEMA(_FoldsEMAOnCompute, MIZScore):
    """MI-ZScore with the std replaced by its EMA over computes (decay 0.9; the first compute
    initialises it, and the current std is folded in before use, as in the reference)."""

    def __init__(self, decay: float = 0.9, std_eps: float = STD_EPS, **kwargs) -> None:
        _check_decay(decay)
        super().__init__(std_eps=std_eps, **kwargs)
        self.decay = decay
        self.register_buffer("ema_marginal_std", torch.tensor(float("nan"), dtype=torch.float64))

    def compute(self) -> Tensor:
        sums = self._sums()
        return mi_estimate(sums) / (self._fold(self.ema_marginal_std, marginal_std(sums)) + self.std_eps)


class MIDiagnostics(_FoldsEMAOnCompute):
    """The whole MI proxy family from one pass over per-token (L_tok) and per-sequence (L_sum) scores.

    `update(scores_tok, scores_sum, target, column_groups=None)`; `compute()` returns a dict of 0-dim
    float64 tensors: retrieval_acc / retrieval_chance / retrieval_above_chance, recall@k /
    recall@k_chance / recall@k_above_chance (k = 2, 4, 8), mi_est, mi_seq_est, mi_zscore(_seq),
    mi_zscore_ema(_seq), cond_entropy(_seq), reasoning_entropy(_seq), matched_logprob(_seq),
    marginal_logprob(_seq), marginal_std(_seq), mi_upper_bound (mean log N), num_rows, num_columns
    (mean N). Retrieval uses L_tok only, as in the reference.
    """

    is_differentiable = False
    full_state_update = False
    higher_is_better = None

    def __init__(
        self, decay: float = 0.9, std_eps: float = STD_EPS, recall_ks: tuple[int, ...] = RECALL_KS, **kwargs
    ) -> None:
        _check_decay(decay)
        if any(not isinstance(k, int) or k < 2 for k in recall_ks):
            raise ValueError(f"recall_ks must be ints >= 2 (k = 1 is retrieval_acc), got {recall_ks}")
        super().__init__(**kwargs)
        self.decay, self.std_eps, self.recall_ks = decay, std_eps, (1, *recall_ks)
        seq_sums = [f"seq_{name}" for name in _LOGPROB_SUMS]
        for name in (*_ROW_COUNTS, *_LOGPROB_SUMS, *seq_sums, *retrieval_state_names(self.recall_ks)):
            self.add_state(name, torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.register_buffer("ema_marginal_std", torch.tensor(float("nan"), dtype=torch.float64))
        self.register_buffer("ema_marginal_std_seq", torch.tensor(float("nan"), dtype=torch.float64))

    def update(
        self, scores_tok: Tensor, scores_sum: Tensor, target: Tensor, column_groups: Tensor | None = None
    ) -> None:
        """Add rows: scores_tok, scores_sum [R, N] float (L_tok, L_sum), target [R] long, column_groups [N] long."""
        if scores_sum.shape != scores_tok.shape:
            raise ValueError(
                f"scores_sum shape {tuple(scores_sum.shape)} must equal scores_tok shape {tuple(scores_tok.shape)}"
            )
        updates = score_row_sums(scores_tok, target, column_groups, self.recall_ks)
        seq_sums = score_row_sums(scores_sum, target, column_groups)
        updates.update({f"seq_{name}": seq_sums[name] for name in _LOGPROB_SUMS})
        # one copy to the states' device for all sums (each small copy to a GPU waits for it)
        values = torch.stack([value.double() for value in updates.values()]).to(self.device)
        for name, value in zip(updates, values.unbind(), strict=True):
            setattr(self, name, getattr(self, name) + value)

    def compute(self) -> dict[str, Tensor]:
        rows = self.num_rows
        out = {}
        for k in self.recall_ks:
            value, prefix = ("retrieval_acc", "retrieval") if k == 1 else (f"recall@{k}", f"recall@{k}")
            out[value] = getattr(self, f"hits_top{k}") / rows
            out[f"{prefix}_chance"] = (getattr(self, f"chance_top{k}_sum") / rows).clamp(max=1.0)
            out[f"{prefix}_above_chance"] = out[value] - out[f"{prefix}_chance"]
        counts = {name: getattr(self, name) for name in _ROW_COUNTS}
        variants = (
            ("", {name: getattr(self, name) for name in _LOGPROB_SUMS}, self.ema_marginal_std),
            ("_seq", {name: getattr(self, f"seq_{name}") for name in _LOGPROB_SUMS}, self.ema_marginal_std_seq),
        )
        for suffix, logprob_sums, ema in variants:
            sums = {**counts, **logprob_sums}
            mi, std = mi_estimate(sums), marginal_std(sums)
            out["mi_seq_est" if suffix else "mi_est"] = mi
            out[f"mi_zscore{suffix}"] = mi / (std + self.std_eps)
            out[f"mi_zscore_ema{suffix}"] = mi / (self._fold(ema, std) + self.std_eps)
            out[f"matched_logprob{suffix}"] = sums["matched_sum"] / rows
            out[f"marginal_logprob{suffix}"] = sums["marginal_sum"] / rows
            out[f"cond_entropy{suffix}"] = -out[f"matched_logprob{suffix}"]
            out[f"reasoning_entropy{suffix}"] = -out[f"marginal_logprob{suffix}"]
            out[f"marginal_std{suffix}"] = std
        out["mi_upper_bound"] = self.log_num_columns_sum / rows
        out["num_rows"] = rows.clone()
        out["num_columns"] = self.num_columns_sum / rows
        return out


def _check_decay(decay: float) -> None:
    if not 0.0 <= decay < 1.0:
        raise ValueError(f"decay must be in [0, 1), got {decay}")
