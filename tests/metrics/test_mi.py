"""The MI proxy family against hand-computed cases and an independent float64 reference of docs/METHOD.md §3."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen_lit.metrics import (
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
)

EPS = 1e-3


def reference_family(tok: list[list[float]], seq: list[list[float]], target: list[int], groups: list[int] | None):
    """docs/METHOD.md §3 written out with Python floats: one loop per definition, no torch."""
    rows, columns = len(tok), len(tok[0])
    groups = list(range(columns)) if groups is None else groups

    def ranked(row):  # highest score first, lower column index first among equal scores
        return sorted(range(columns), key=lambda j: (-row[j], j))

    def matched_marginal(scores):
        matched = [scores[r][target[r]] for r in range(rows)]
        marginal = []
        for row in scores:
            top = max(row)
            marginal.append(top + math.log(sum(math.exp(v - top) for v in row)) - math.log(columns))
        return matched, marginal

    out = {}
    chance = sum(sum(groups[j] == groups[target[r]] for j in range(columns)) / columns for r in range(rows)) / rows
    for k in (1, 2, 4, 8):
        k_eff = min(k, columns)
        hits = sum(any(groups[j] == groups[target[r]] for j in ranked(tok[r])[:k_eff]) for r in range(rows)) / rows
        name = "retrieval" if k == 1 else f"recall@{k}"
        out["retrieval_acc" if k == 1 else name] = hits
        out[f"{name}_chance"] = min(1.0, chance * k_eff)
        out[f"{name}_above_chance"] = hits - min(1.0, chance * k_eff)
    for suffix, scores in (("", tok), ("_seq", seq)):
        matched, marginal = matched_marginal(scores)
        mean_matched, mean_marginal = sum(matched) / rows, sum(marginal) / rows
        std = math.sqrt(sum((m - mean_marginal) ** 2 for m in marginal) / rows)
        mi = mean_matched - mean_marginal
        out["mi_seq_est" if suffix else "mi_est"] = mi
        out[f"mi_zscore{suffix}"] = sum((a - b) / (std + EPS) for a, b in zip(matched, marginal)) / rows
        out[f"mi_zscore_ema{suffix}"] = out[f"mi_zscore{suffix}"]  # first compute: EMA = current std
        out[f"cond_entropy{suffix}"] = -mean_matched
        out[f"reasoning_entropy{suffix}"] = -mean_marginal
        out[f"matched_logprob{suffix}"] = mean_matched
        out[f"marginal_logprob{suffix}"] = mean_marginal
        out[f"marginal_std{suffix}"] = std
    out["mi_upper_bound"] = math.log(columns)
    out["num_rows"] = rows
    out["num_columns"] = columns
    return out


def random_case(seed: int, rows: int, columns: int, duplicates: bool, ties: bool):
    """Scores [R, N] (rounded so that ties occur when asked), targets and optional column groups."""
    generator = torch.Generator().manual_seed(seed)
    tok = torch.randn(rows, columns, generator=generator, dtype=torch.float64) - 2
    if ties:
        tok = (tok * 2).round() / 2
    seq = tok * torch.randint(1, 30, (rows, 1), generator=generator)
    target = torch.randint(0, columns, (rows,), generator=generator)
    groups = torch.randint(0, max(1, columns // 2), (columns,), generator=generator) if duplicates else None
    return tok, seq, target, groups


def assert_family_close(got: dict, want: dict, atol=1e-9):
    assert set(got) == set(want)
    for name in want:
        assert float(got[name]) == pytest.approx(want[name], abs=atol, rel=1e-9), name


def test_hand_case_two_by_two():
    scores = torch.tensor([[-1.0, -2.0], [-3.0, -0.5]])
    target = torch.tensor([0, 1])
    matched, marginal = matched_and_marginal(scores.double(), target)
    # marginal_0 = log((e^-1 + e^-2)/2), marginal_1 = log((e^-3 + e^-0.5)/2)
    torch.testing.assert_close(marginal, torch.tensor([-1.3798854930, -1.1142574463], dtype=torch.float64))
    torch.testing.assert_close(matched, torch.tensor([-1.0, -0.5], dtype=torch.float64))
    expected = {
        MIRetrievalAcc(): 1.0,
        MIRecallAtK(2): 1.0,
        MIEstimate(): 0.4970714697,  # -0.75 - (-1.2470714697)
        ConditionalEntropy(): 0.75,
        ReasoningEntropy(): 1.2470714697,
        MIZScore(): 0.4970714697 / (0.1328140234 + EPS),  # population std = |m0 - m1| / 2
        MIZScoreEMA(): 0.4970714697 / (0.1328140234 + EPS),
    }
    for metric, value in expected.items():
        metric.update(scores, target)
        assert float(metric.compute()) == pytest.approx(value, abs=1e-8), type(metric).__name__


def test_hand_case_three_by_three_with_duplicate_columns_and_ties():
    # columns 0 and 1 hold the same prompt
    groups = torch.tensor([7, 7, 3])
    scores = torch.tensor(
        [
            [-2.0, -1.0, -3.0],  # true 0: argmax is column 1, equivalent -> hit
            [-1.0, -1.0, -1.0],  # true 2: three-way tie -> column 0 first -> miss
            [-5.0, -4.0, -4.0],  # true 1: tie of columns 1 and 2 -> column 1 first -> hit
        ]
    )
    target = torch.tensor([0, 2, 1])
    assert retrieval_hits(scores, target, 1, groups).tolist() == [True, False, True]
    assert retrieval_hits(scores, target, 2, groups).tolist() == [True, False, True]
    assert retrieval_hits(scores, target, 3, groups).tolist() == [True, True, True]
    assert retrieval_hits(scores, target, 1).tolist() == [False, False, True]
    # chance per row: 2/3, 1/3, 2/3
    assert float(retrieval_chance(target, groups)) == pytest.approx(5 / 9)
    assert float(recall_chance(target, 2, groups)) == 1.0
    diagnostics = MIDiagnostics()
    diagnostics.update(scores, scores * 4, target, groups)
    out = diagnostics.compute()
    assert float(out["retrieval_acc"]) == pytest.approx(2 / 3)
    assert float(out["retrieval_chance"]) == pytest.approx(5 / 9)
    assert float(out["retrieval_above_chance"]) == pytest.approx(1 / 9)
    assert float(out["recall@2"]) == pytest.approx(2 / 3) and float(out["recall@2_chance"]) == 1.0
    assert float(out["recall@8"]) == 1.0 and float(out["mi_upper_bound"]) == pytest.approx(math.log(3))


def test_chance_levels_of_the_reference():
    target = torch.arange(8).repeat(2)
    assert float(retrieval_chance(target, num_columns=8)) == 0.125
    assert [float(recall_chance(target, k, num_columns=8)) for k in (2, 4, 8, 16)] == [0.25, 0.5, 1.0, 1.0]
    assert float(retrieval_chance(target, torch.arange(8))) == 0.125
    assert float(retrieval_chance(torch.zeros(3, dtype=torch.long), num_columns=64)) == pytest.approx(1 / 64)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("duplicates", [False, True])
def test_matches_independent_reference(seed, duplicates):
    tok, seq, target, groups = random_case(
        seed, rows=5 + 3 * seed, columns=1 + seed, duplicates=duplicates, ties=seed % 2 == 0
    )
    metric = MIDiagnostics()
    metric.update(tok.float(), seq.float(), target, groups)
    want = reference_family(
        tok.float().double().tolist(),
        seq.float().double().tolist(),
        target.tolist(),
        None if groups is None else groups.tolist(),
    )
    assert_family_close(metric.compute(), want)


def test_single_metrics_equal_the_collection():
    tok, seq, target, groups = random_case(3, rows=20, columns=8, duplicates=True, ties=True)
    diagnostics = MIDiagnostics()
    diagnostics.update(tok, seq, target, groups)
    out = diagnostics.compute()
    pairs = [
        (MIRetrievalAcc(), tok, "retrieval_acc"),
        (MIRecallAtK(4), tok, "recall@4"),
        (MIEstimate(), tok, "mi_est"),
        (MISeqEstimate(), seq, "mi_seq_est"),
        (MIZScore(), tok, "mi_zscore"),
        (MIZScoreEMA(), seq, "mi_zscore_ema_seq"),
        (ConditionalEntropy(), seq, "cond_entropy_seq"),
        (ReasoningEntropy(), tok, "reasoning_entropy"),
    ]
    for metric, scores, name in pairs:
        metric.update(scores, target, groups)
        assert float(metric.compute()) == pytest.approx(float(out[name]), abs=1e-12), name


def test_template_collapse_gives_chance_and_zero_mi():
    """Every reasoning scores the same under every prompt: ties everywhere, nothing input-dependent."""
    target = torch.arange(8).repeat_interleave(4)
    scores = torch.full((32, 1), -1.7).expand(32, 8) + torch.linspace(0, 1, 32)[:, None]
    diagnostics = MIDiagnostics()
    diagnostics.update(scores, scores * 12, target)
    out = diagnostics.compute()
    assert float(out["retrieval_acc"]) == float(out["retrieval_chance"]) == 0.125
    assert float(out["recall@4"]) == float(out["recall@4_chance"]) == 0.5
    assert abs(float(out["mi_est"])) < 1e-12 and abs(float(out["mi_seq_est"])) < 1e-12


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    rows=st.integers(1, 12),
    columns=st.integers(1, 9),
    duplicates=st.booleans(),
    data=st.data(),
)
def test_order_and_split_of_rows_do_not_matter(seed, rows, columns, duplicates, data):
    tok, seq, target, groups = random_case(seed, rows, columns, duplicates, ties=seed % 3 == 0)
    whole = MIDiagnostics()
    whole.update(tok, seq, target, groups)
    expected = whole.compute()

    order = torch.tensor(data.draw(st.permutations(range(rows))))
    cuts = sorted(data.draw(st.lists(st.integers(0, rows), max_size=4)))
    pieces = MIDiagnostics()
    for start, stop in zip([0, *cuts], [*cuts, rows]):
        part = order[start:stop]
        pieces.update(tok[part], seq[part], target[part], groups)
    got = pieces.compute()
    for name in expected:
        assert float(got[name]) == pytest.approx(float(expected[name]), abs=1e-9, rel=1e-9), name


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), rows=st.integers(1, 12), columns=st.integers(1, 9))
def test_mi_is_entropy_difference_bounded_by_log_n_and_row_shift_invariant(seed, rows, columns):
    tok, seq, target, _ = random_case(seed, rows, columns, duplicates=False, ties=False)
    shift = torch.randn(rows, 1, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64) * 5
    base, shifted = MIDiagnostics(), MIDiagnostics()
    base.update(tok, seq, target)
    shifted.update(tok + shift, seq + shift, target)
    out, moved = base.compute(), shifted.compute()
    for suffix, mi in (("", "mi_est"), ("_seq", "mi_seq_est")):
        identity = out[f"reasoning_entropy{suffix}"] - out[f"cond_entropy{suffix}"]
        assert float(out[mi]) == pytest.approx(float(identity), abs=1e-12)
        assert float(out[mi]) <= float(out["mi_upper_bound"]) + 1e-12
        assert float(moved[mi]) == pytest.approx(float(out[mi]), abs=1e-9)
    assert float(moved["retrieval_acc"]) == float(out["retrieval_acc"])


def test_ema_folds_each_compute_survives_reset_and_round_trips_state_dict():
    tok_a, seq_a, target_a, _ = random_case(1, rows=10, columns=4, duplicates=False, ties=False)
    tok_b, seq_b, target_b, _ = random_case(2, rows=10, columns=4, duplicates=False, ties=False)
    std_a = reference_family(tok_a.tolist(), seq_a.tolist(), target_a.tolist(), None)["marginal_std"]
    want_b = reference_family(tok_b.tolist(), seq_b.tolist(), target_b.tolist(), None)
    ema_b = 0.9 * std_a + 0.1 * want_b["marginal_std"]

    metric = MIZScoreEMA(decay=0.9)
    metric.update(tok_a, target_a)
    metric.compute()
    assert float(metric.ema_marginal_std) == pytest.approx(std_a)
    metric.reset()
    assert float(metric.ema_marginal_std) == pytest.approx(std_a)

    restored = MIZScoreEMA(decay=0.9)
    restored.load_state_dict(metric.state_dict())
    for m in (metric, restored):
        m.update(tok_b, target_b)
        assert float(m.compute()) == pytest.approx(want_b["mi_est"] / (ema_b + EPS), abs=1e-10)
        assert float(m.ema_marginal_std) == pytest.approx(ema_b)
        assert float(m.compute()) == pytest.approx(want_b["mi_est"] / (ema_b + EPS))  # cached: no second fold
    assert "ema_marginal_std" in metric.state_dict()


def test_forward_gives_the_batch_value_without_moving_the_ema():
    tok_a, seq_a, target_a, _ = random_case(1, rows=10, columns=4, duplicates=False, ties=False)
    tok_b, seq_b, target_b, _ = random_case(2, rows=10, columns=4, duplicates=False, ties=False)
    std_a = reference_family(tok_a.tolist(), seq_a.tolist(), target_a.tolist(), None)["marginal_std"]
    want_b = reference_family(tok_b.tolist(), seq_b.tolist(), target_b.tolist(), None)
    folded = want_b["mi_est"] / (0.9 * std_a + 0.1 * want_b["marginal_std"] + EPS)

    metric = MIZScoreEMA()
    metric.update(tok_a, target_a)
    metric.compute()
    metric.reset()
    assert float(metric(tok_b, target_b)) == pytest.approx(folded)
    assert float(metric.ema_marginal_std) == pytest.approx(std_a)
    assert float(metric.compute()) == pytest.approx(folded)
    assert float(metric.ema_marginal_std) != pytest.approx(std_a)

    diagnostics = MIDiagnostics()
    batch = diagnostics(tok_b, seq_b, target_b)
    assert float(batch["mi_zscore_ema"]) == pytest.approx(want_b["mi_zscore"])
    assert torch.isnan(diagnostics.ema_marginal_std) and torch.isnan(diagnostics.ema_marginal_std_seq)


def test_diagnostics_ema_state_dict_round_trip():
    tok_a, seq_a, target_a, _ = random_case(4, rows=9, columns=3, duplicates=False, ties=False)
    tok_b, seq_b, target_b, _ = random_case(5, rows=7, columns=3, duplicates=False, ties=False)
    first = MIDiagnostics()
    first.update(tok_a, seq_a, target_a)
    first.compute()
    first.reset()
    second = MIDiagnostics()
    second.load_state_dict(first.state_dict())
    assert set(first.state_dict()) == {"ema_marginal_std", "ema_marginal_std_seq"}
    for metric in (first, second):
        metric.update(tok_b, seq_b, target_b)
    continued, resumed = first.compute(), second.compute()
    assert_family_close(resumed, {k: float(v) for k, v in continued.items()})
    assert float(resumed["mi_zscore_ema_seq"]) != pytest.approx(float(resumed["mi_zscore_seq"]))


def test_compute_without_rows_is_nan_and_leaves_ema():
    metric = MIZScoreEMA()
    metric.update(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long))
    assert torch.isnan(metric.compute())
    assert torch.isnan(metric.ema_marginal_std)


@pytest.mark.parametrize(
    "scores, target, groups, message",
    [
        (torch.zeros(3), torch.zeros(3, dtype=torch.long), None, "scores"),
        (torch.zeros(2, 0), torch.zeros(2, dtype=torch.long), None, "scores"),
        (torch.tensor([[0.0, float("nan")]]), torch.zeros(1, dtype=torch.long), None, "finite"),
        (torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, dtype=torch.long), None, "float"),
        (torch.zeros(2, 3), torch.zeros(3, dtype=torch.long), None, "target"),
        (torch.zeros(2, 3), torch.zeros(2), None, "target"),
        (torch.zeros(2, 3), torch.tensor([0, 3]), None, "target"),
        (torch.zeros(2, 3), torch.tensor([0, 1]), torch.tensor([0, 1]), "column_groups"),
    ],
)
def test_bad_inputs_raise(scores, target, groups, message):
    with pytest.raises(ValueError, match=message):
        MIRetrievalAcc().update(scores, target, groups)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="k"):
        MIRecallAtK(0)
    with pytest.raises(ValueError, match="decay"):
        MIZScoreEMA(decay=1.0)
    with pytest.raises(ValueError, match="num_columns"):
        retrieval_chance(torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="num_columns"):
        retrieval_chance(torch.zeros(2, dtype=torch.long), torch.arange(3), num_columns=4)
    with pytest.raises(ValueError, match="scores_sum"):
        MIDiagnostics().update(torch.zeros(2, 3), torch.zeros(2, 2), torch.zeros(2, dtype=torch.long))
