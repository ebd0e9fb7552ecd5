"""`folded_gqa`: a model's sdpa attention on the folded grouped-query heads gives the same logits, folds each
forward's mask once and gives its setting back."""

from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from ragen_lit.kernels.gqa_attention import additive_mask, fold_mask
from ragen_lit.models import gqa_attention
from ragen_lit.models.gqa_attention import NAME, folded_gqa


def test_a_model_under_folded_gqa_gives_the_same_logits_and_gets_its_setting_back(monkeypatch):
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, attn_implementation="sdpa",
    )  # fmt: skip
    model = Qwen2ForCausalLM(config).eval()
    ids = torch.randint(0, 50, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 6:], mask[2, :3] = 0, 0  # right and left padding: a 4D mask reaches the attention
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
        folds, conversions = [], []
        monkeypatch.setattr(gqa_attention, "fold_mask", lambda *a: folds.append(1) or fold_mask(*a))
        monkeypatch.setattr(gqa_attention, "additive_mask", lambda *a: conversions.append(1) or additive_mask(*a))
        seen = []
        sdpa = torch.nn.functional.scaled_dot_product_attention
        monkeypatch.setattr(
            torch.nn.functional,
            "scaled_dot_product_attention",
            lambda *a, **k: seen.append(k["attn_mask"]) or sdpa(*a, **k),
        )
        with folded_gqa(model):
            assert model.config._attn_implementation == NAME
            got = model(input_ids=ids, attention_mask=mask).logits
            assert len(folds) == len(conversions) == 1  # folded and made additive once for the forward's two layers
            model(input_ids=ids, attention_mask=mask)
            assert len(folds) == len(conversions) == 2  # a new forward, a new mask
        # sdpa gets the additive mask, not a bool one it would convert at every layer
        assert len(seen) == 4 and all(m.dtype == torch.float32 for m in seen)
    assert model.config._attn_implementation == "sdpa"
    assert not gqa_attention._last_fold  # nothing kept alive after the context
    torch.testing.assert_close(got, want)
