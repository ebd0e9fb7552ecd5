"""The online diagnostics score reasonings at the rollout temperature they were sampled at."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from ragen_lit.config import DiagnosticsConfig
from ragen_lit.metrics import collapse
from ragen_lit.metrics.collapse import CollapseDiagnostics


def test_maybe_compute_passes_the_rollout_temperature_to_the_cross_scorer(monkeypatch):
    seen = []

    def fake_cross_score(policy, prompts, reasonings, **kwargs):
        seen.append(kwargs["temperature"])
        scores = torch.eye(len(reasonings), len(prompts))
        return scores, scores

    monkeypatch.setattr(collapse, "cross_score", fake_cross_score)
    turn = SimpleNamespace(reasoning="think", prompt_end=2)
    trajectories = [SimpleNamespace(turns=[turn], token_ids=[g + 1, 7, 9], group=g) for g in range(3)]
    chat = SimpleNamespace(encode=lambda text: [5, 6], tokenizer=SimpleNamespace(pad_token_id=0))
    policy = torch.nn.Linear(1, 1)
    cfg = DiagnosticsConfig(every_n_iterations=1, num_samples=3, max_tokens_per_forward=64)
    CollapseDiagnostics(cfg).maybe_compute(policy, chat, trajectories, iteration=1, temperature=0.7)
    assert seen == [0.7, 0.7]  # first-turn and trajectory scopes
