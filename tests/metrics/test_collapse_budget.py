"""`diagnostics.max_tokens_per_forward`: 0 resolves by device, a value is kept."""

from __future__ import annotations

import pytest
import torch
import transformers

from ragen_lit.metrics.collapse import gpu_tokens_per_forward, kv_bytes_per_token, tokens_per_forward


def test_auto_budget_is_the_cpu_bound_on_cpu_and_a_set_value_wins():
    model = torch.nn.Linear(2, 2)
    assert tokens_per_forward(model, 0) == 8192
    assert tokens_per_forward(model, 300) == 300


def test_kv_bytes_per_token_of_the_bench_shape_and_of_configs_without_kv_heads():
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


class _FakeCudaParam:
    device = torch.device("cuda", 0)

    def element_size(self) -> int:
        return 4


class _FakeCudaPolicy:
    """A policy whose weights report a CUDA device: what `tokens_per_forward` reads, without a GPU."""

    def __init__(self, config):
        self.config = config

    def parameters(self):
        yield _FakeCudaParam()


def test_auto_budget_on_a_gpu_is_sized_by_the_share_the_process_may_take(monkeypatch):
    gib = 2**30
    config = transformers.LlamaConfig(
        hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3
    )
    kv = kv_bytes_per_token(config, 4)  # SmolLM2-135M in float32: 46,080 bytes
    props = type("Props", (), {"total_memory": 140 * gib})()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    fraction = {"value": 1.0}
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device: fraction["value"])
    policy = _FakeCudaPolicy(config)
    assert tokens_per_forward(policy, 0) == 140 * gib // 20 // kv == 163111  # the whole card
    fraction["value"] = 0.158  # one of six runs sharing the card (`sweep --devices 0,0,0,0,0,0`)
    assert tokens_per_forward(policy, 0) == int(140 * gib * 0.158) // 20 // kv == 25771
    assert tokens_per_forward(policy, 4096) == 4096  # a set value still wins


@pytest.mark.cuda
def test_auto_budget_follows_the_process_memory_cap_on_a_real_gpu():
    from ragen_lit.training.gpu_memory import cap_process_memory

    device = torch.device("cuda", 0)
    config = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(config).to(device)
    kv = kv_bytes_per_token(config, 4)
    total = torch.cuda.get_device_properties(device).total_memory
    before = torch.cuda.get_per_process_memory_fraction(device)
    try:
        cap_process_memory(device, 0.05)
        assert tokens_per_forward(model, 0) == gpu_tokens_per_forward(int(total * 0.05), kv)
        cap_process_memory(device, 1.0)
        assert tokens_per_forward(model, 0) == gpu_tokens_per_forward(total, kv)
    finally:
        torch.cuda.set_per_process_memory_fraction(before, device)
