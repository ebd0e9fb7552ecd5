"""The online diagnostics score reasonings at the rollout temperature they were sampled at, on the masked-attention
kernels the config names, both scopes in one scorer call, and time the scoring."""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch

from ragen_lit.config import DiagnosticsConfig
from ragen_lit.metrics import collapse
from ragen_lit.metrics.collapse import CollapseDiagnostics


def _diagnostics(monkeypatch, seen, sleep=0.0):
    """`maybe_compute` over 3 one-turn trajectories with a fake scorer (which sleeps `sleep` seconds)."""

    def fake_cross_score_scopes(policy, prompts, reasonings, **kwargs):
        reasonings = reasonings()  # the texts are tokenised when the scorer asks
        seen.append((len(prompts), kwargs["temperature"], kwargs["attention"], reasonings[0][0]))
        time.sleep(sleep)
        return [(torch.eye(len(rows), len(columns)),) * 2 for columns, rows in zip(prompts, reasonings, strict=True)]

    monkeypatch.setattr(collapse, "cross_score_scopes", fake_cross_score_scopes)
    turn = SimpleNamespace(reasoning="think", prompt_end=2, reasoning_end=None)  # re-encoded: no token boundary
    trajectories = [SimpleNamespace(turns=[turn], token_ids=[g + 1, 7, 9], group=g) for g in range(3)]
    chat = SimpleNamespace(encode_many=lambda texts: [[5, 6] for _ in texts], tokenizer=SimpleNamespace(pad_token_id=0))
    policy = torch.nn.Linear(1, 1)
    cfg = DiagnosticsConfig(every_n_iterations=1, num_samples=3, max_tokens_per_forward=64, attention="auto")
    return CollapseDiagnostics(cfg).maybe_compute(policy, chat, trajectories, iteration=1, temperature=0.7)


def test_maybe_compute_scores_both_scopes_in_one_call_at_the_rollout_temperature_and_attention(monkeypatch):
    seen = []
    out = _diagnostics(monkeypatch, seen)
    assert seen == [(2, 0.7, "auto", [5, 6])]  # both scopes together, tokenised on demand; diagnostics.attention
    assert out["collapse/first_turn/retrieval_acc"] == 1.0 and out["collapse/trajectory/retrieval_acc"] == 1.0


def test_the_scoring_logs_the_seconds_it_took(monkeypatch):
    out = _diagnostics(monkeypatch, [], sleep=0.2)
    assert 0.2 <= out["time/diagnostics_scoring_s"] < 5


def test_the_metrics_stay_on_the_host_when_the_module_moves():
    """Their updates and computes are ~400 scalar operations: launched on a GPU they kept the device idle ~13 ms."""
    diagnostics = CollapseDiagnostics(DiagnosticsConfig())
    module = torch.nn.Module()
    module.collapse = diagnostics
    module.to(torch.float16)  # a move that would reach every state and buffer
    for metric in (diagnostics.first_turn, diagnostics.trajectory):
        assert metric.num_rows.dtype == torch.float64 and metric.num_rows.device.type == "cpu"
        assert metric.ema_marginal_std.dtype == torch.float64
