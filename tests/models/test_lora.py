"""`models.lora.apply_lora`: which parameters train, what the adapted layer computes, and the one-line errors for
a module name the model lacks and for a missing peft."""

from __future__ import annotations

import sys

import pytest
import torch
from tests.models.tiny_qwen2 import tiny_qwen2

from ragen_lit.errors import ConfigError
from ragen_lit.models import apply_lora, linear_layer_names

pytestmark = pytest.mark.floors
ADAPTERS = {"r": 2, "alpha": 4.0, "dropout": 0.0}


def test_all_linear_adapts_every_decoder_projection_and_only_the_adapters_train():
    model = apply_lora(tiny_qwen2(), **ADAPTERS, target_modules=["all-linear"], causal_lm=True)
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    # 2 layers x 7 projections x (A, B); the tied embedding / vocabulary head gets none
    assert len(trainable) == 2 * 7 * 2
    assert all(".lora_A.default." in n or ".lora_B.default." in n for n in trainable)
    assert not any("lm_head" in n or "embed_tokens" in n for n in trainable)


def test_an_adapted_layer_computes_w_x_plus_alpha_over_r_b_a_x():
    model = apply_lora(tiny_qwen2(), **ADAPTERS, target_modules=["q_proj"], causal_lm=True)
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_()
    x = torch.randn(3, 16)
    w, a, b = layer.base_layer.weight, layer.lora_A["default"].weight, layer.lora_B["default"].weight
    expected = x @ w.T + layer.base_layer.bias + (4.0 / 2) * (x @ a.T @ b.T)
    torch.testing.assert_close(layer(x), expected)


def test_the_critics_bare_backbone_takes_adapters_too():
    backbone = tiny_qwen2().model  # a decoder without a head, as `load_critic` loads it
    adapted = apply_lora(backbone, **ADAPTERS, target_modules=["q_proj", "v_proj"], causal_lm=False)
    trainable = {name.split(".")[-4] for name, p in adapted.named_parameters() if p.requires_grad}
    assert trainable == {"q_proj", "v_proj"}
    out = adapted(input_ids=torch.tensor([[1, 2, 3]])).last_hidden_state
    assert out.shape == (1, 3, 16)


def test_a_module_name_the_model_lacks_is_one_line_naming_the_key_and_the_models_layers():
    with pytest.raises(ConfigError) as error:
        apply_lora(tiny_qwen2(), **ADAPTERS, target_modules=["q_proj", "qkv_proj"], causal_lm=True)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("model.lora.target_modules=['q_proj', 'qkv_proj']: Qwen2ForCausalLM has no module named")
    assert "qkv_proj" in message and "down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj" in message


def test_linear_layer_names():
    assert linear_layer_names(tiny_qwen2()) == [
        "down_proj",
        "gate_proj",
        "k_proj",
        "lm_head",
        "o_proj",
        "q_proj",
        "up_proj",
        "v_proj",
    ]


def test_without_peft_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # `import peft` fails as if not installed
    with pytest.raises(ConfigError) as error:
        apply_lora(tiny_qwen2(), **ADAPTERS, target_modules=["all-linear"], causal_lm=True)
    assert str(error.value) == "model.lora.r=2 needs peft for LoRA: pip install 'ragen_lit[lora]'"
