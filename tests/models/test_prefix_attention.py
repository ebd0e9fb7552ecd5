"""The packed-rows attention of the cross-scorer as a model's attention: what it does not implement is refused."""

from __future__ import annotations

import pytest
import torch

from ragen_lit.kernels.varlen_attention import UnsupportedAttention
from ragen_lit.models.prefix_attention import RowSegments, packed_rows, prefix_rows_attention


def test_features_it_does_not_implement_are_refused_not_ignored():
    class Attention(torch.nn.Module):
        layer_idx = 0

    tensors = (torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))
    segments = RowSegments(cu_rows=torch.tensor([0, 3], dtype=torch.int32), max_row=3)
    model = torch.nn.Module()
    model.config = type("Config", (), {"_attn_implementation": "sdpa"})()
    with packed_rows(model, segments):
        assert model.config._attn_implementation == "ragen_prefix_rows"
        out, _ = prefix_rows_attention(Attention(), *tensors, None)
        assert out.shape == (1, 3, 2, 4)
        for kwargs in ({"sliding_window": 4}, {"softcap": 30.0}, {"dropout": 0.1}):
            with pytest.raises(UnsupportedAttention):
                prefix_rows_attention(Attention(), *tensors, None, **kwargs)
    assert model.config._attn_implementation == "sdpa"
