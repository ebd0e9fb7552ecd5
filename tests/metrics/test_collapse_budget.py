"""`diagnostics.max_tokens_per_forward`: 0 resolves by device, a value is kept."""

from __future__ import annotations

import torch

from ragen_lit.metrics.collapse import gpu_tokens_per_forward, kv_bytes_per_token, tokens_per_forward


def test_auto_budget_is_the_cpu_bound_on_cpu_and_a_set_value_wins():
    model = torch.nn.Linear(2, 2)
    assert tokens_per_forward(model, 0) == 8192
    assert tokens_per_forward(model, 300) == 300


def test_kv_bytes_per_token_of_the_bench_shape_and_of_configs_without_kv_heads():
    import transformers

    qwen05 = transformers.Qwen2Config(
        hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2
    )
    assert kv_bytes_per_token(qwen05, 2) == 2 * 24 * 2 * 64 * 2 == 12288
    mha = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=None)
    assert kv_bytes_per_token(mha, 4) == 2 * 3 * 4 * 16 * 4


def test_gpu_budget_scales_with_the_card_and_the_model_within_its_bounds():
    gib = 2**30
    assert gpu_tokens_per_forward(80 * gib, 12288) == 262144  # H100, Qwen2.5-0.5B: the cap
    assert gpu_tokens_per_forward(24 * gib, 12288) == 24 * gib // 20 // 12288 == 104857
    assert gpu_tokens_per_forward(80 * gib, 57344) == 74898  # a 7B-shape cache (28 layers x 4 KV heads x 128)
    assert gpu_tokens_per_forward(1 * gib, 57344) == 8192  # never below the CPU bound
