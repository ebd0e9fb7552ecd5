"""The online diagnostics score reasonings at the rollout temperature they were sampled at, on the masked-attention
kernels the config names, and time each scope."""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch

from ragen_lit.config import DiagnosticsConfig
from ragen_lit.metrics import collapse
from ragen_lit.metrics.collapse import CollapseDiagnostics


def _diagnostics(monkeypatch, seen, sleep=()):
    """`maybe_compute` over 3 one-turn trajectories with a fake scorer (the i-th call sleeps `sleep[i]` seconds)."""

    def fake_cross_score(policy, prompts, reasonings, **kwargs):
        seen.append((kwargs["temperature"], kwargs["attention"]))
        time.sleep(sleep[len(seen) - 1] if len(seen) <= len(sleep) else 0)
        scores = torch.eye(len(reasonings), len(prompts))
        return scores, scores

    monkeypatch.setattr(collapse, "cross_score", fake_cross_score)
    turn = SimpleNamespace(reasoning="think", prompt_end=2)
    trajectories = [SimpleNamespace(turns=[turn], token_ids=[g + 1, 7, 9], group=g) for g in range(3)]
    chat = SimpleNamespace(encode_many=lambda texts: [[5, 6] for _ in texts], tokenizer=SimpleNamespace(pad_token_id=0))
    policy = torch.nn.Linear(1, 1)
    cfg = DiagnosticsConfig(every_n_iterations=1, num_samples=3, max_tokens_per_forward=64, attention="auto")
    return CollapseDiagnostics(cfg).maybe_compute(policy, chat, trajectories, iteration=1, temperature=0.7)


def test_maybe_compute_passes_the_rollout_temperature_and_the_attention_kernels_to_the_cross_scorer(monkeypatch):
    seen = []
    _diagnostics(monkeypatch, seen)
    assert seen == [(0.7, "auto"), (0.7, "auto")]  # first-turn and trajectory scopes; diagnostics.attention


def test_each_scope_logs_the_seconds_it_took(monkeypatch):
    out = _diagnostics(monkeypatch, [], sleep=(0.0, 0.2))  # the trajectory scope's scoring is the slow one
    assert 0.2 <= out["time/diagnostics_trajectory_s"] < 5
    assert 0 <= out["time/diagnostics_first_turn_s"] < 0.2
