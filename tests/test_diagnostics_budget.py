"""`diagnostics.max_tokens_per_forward`: 0 resolves by device, a value is kept."""
from __future__ import annotations

import torch

from ragen_lit.config import DiagnosticsConfig
from ragen_lit.diagnostics import CollapseDiagnostics


def test_auto_budget_is_the_cpu_bound_on_cpu_and_a_set_value_wins():
    model = torch.nn.Linear(2, 2)
    assert CollapseDiagnostics(DiagnosticsConfig()).tokens_per_forward(model) == 8192
    assert CollapseDiagnostics(DiagnosticsConfig(max_tokens_per_forward=300)).tokens_per_forward(model) == 300
