"""`models.fused_projections`: a model's q|k|v and gate|up projections as one product each give the model's logits,
read the weights as of the last `refresh`, leave every forward as it was, and skip layers they cannot fuse."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from ragen_lit.models import compile_layers
from ragen_lit.models.fused_projections import FusedProjections


def small(model_class, config_class, **overrides):
    """A random 2-layer model of `model_class` (4 query heads over 2 key/value heads)."""
    torch.manual_seed(0)
    config = config_class(
        vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, **overrides,
    )  # fmt: skip
    return model_class(config).eval()


def small_qwen2(**overrides) -> Qwen2ForCausalLM:
    return small(Qwen2ForCausalLM, Qwen2Config, **overrides)


def small_llama() -> LlamaForCausalLM:
    return small(LlamaForCausalLM, LlamaConfig)


def small_qwen3() -> Qwen3ForCausalLM:
    return small(Qwen3ForCausalLM, Qwen3Config, head_dim=8)


IDS = torch.tensor([[3, 14, 15, 9, 2, 6], [5, 3, 5, 8, 9, 7]])


def logits(model):
    with torch.no_grad():
        return model(input_ids=IDS).logits


@pytest.mark.parametrize(
    "make", [small_qwen2, small_llama, small_qwen3], ids=["qwen2-biased-qkv", "llama", "qwen3-normed-qk"]
)
def test_fused_products_give_the_models_logits_and_every_forward_back(make):
    model = make()
    fused = FusedProjections(model)
    assert len(fused.attentions) == len(fused.mlps) == 2
    want = logits(model)
    with fused.applied():
        layer = model.model.layers[0]
        assert "forward" in vars(layer.self_attn.q_proj) and "forward" in vars(layer.mlp)
        got = logits(model)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for layer in model.model.layers:
        for module in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.mlp):
            assert "forward" not in vars(module)


def test_one_product_per_input_serves_q_k_and_v(monkeypatch):
    model = small_qwen2()
    fused = FusedProjections(model)
    calls = []
    original = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda *a, **k: calls.append(a[1].shape) or original(*a, **k))
    attention = model.model.layers[0].self_attn
    x = torch.randn(2, 3, 32)
    with fused.applied():
        q, k, v = attention.q_proj(x), attention.k_proj(x), attention.v_proj(x)
        assert calls == [torch.Size([32 + 16 + 16, 32])]  # q (4 heads x 8) | k | v (2 heads x 8 each)
        attention.k_proj(torch.randn(2, 3, 32))  # a new input: a new product
        assert len(calls) == 2
    for got, linear in zip((q, k, v), (attention.q_proj, attention.k_proj, attention.v_proj)):
        torch.testing.assert_close(got, original(x, linear.weight, linear.bias))


def test_the_fused_weights_are_those_of_the_last_refresh_written_in_place():
    model = small_qwen2()
    fused = FusedProjections(model)
    addresses = [shared.weight.data_ptr() for shared in fused.attentions]
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))  # an optimizer step
    want = logits(model)
    with fused.applied():
        stale = logits(model)
    assert not torch.allclose(stale, want, atol=1e-3)
    fused.refresh()
    with fused.applied():
        torch.testing.assert_close(logits(model), want, atol=1e-5, rtol=1e-5)
    assert [shared.weight.data_ptr() for shared in fused.attentions] == addresses  # graphs captured on them hold


def test_compiled_layers_keep_their_dispatchers_and_give_the_same_logits():
    model = small_qwen2()
    compile_layers(model)
    mlp = model.model.layers[0].mlp
    dispatcher = vars(mlp)["forward"]
    fused = FusedProjections(model)
    want = logits(model)
    with fused.applied():
        got = logits(model)
    assert vars(mlp)["forward"] is dispatcher
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_layers_that_cannot_be_fused_keep_their_own_products():
    gelu = FusedProjections(small_qwen2(hidden_act="gelu"))
    assert len(gelu.attentions) == 2 and not gelu.mlps
    import peft

    model = small_qwen2()
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "up_proj"])
    wrapped = peft.get_peft_model(model, config)
    fused = FusedProjections(wrapped)
    assert not fused.attentions and not fused.mlps  # LoRA's q_proj and up_proj are not plain linears
    want = logits(wrapped)
    with fused.applied():
        torch.testing.assert_close(logits(wrapped), want)
