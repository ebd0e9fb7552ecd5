"""`bench.roofline`: the decode byte model by hand."""

from __future__ import annotations

import pytest
import torch
import transformers

from bench.roofline import (
    decode_workload,
    format_achieved,
    format_roofline,
    kv_bytes_per_position,
    model_roofline,
    peak_bandwidth,
    roofline,
    weight_bytes_read,
)


def test_decode_workload_counts_steps_and_attended_positions_by_hand():
    # call 1: rows of prompts 10 and 20 sample 3 and 2 tokens -> contexts 10+11+12 and 20+21, 3 steps
    # call 2: a prompt of 5 samples 4 tokens -> contexts 5+6+7+8, 4 steps
    workload = decode_workload([([10, 20], [3, 2]), ([5], [4])])
    assert (workload.sampled_tokens, workload.steps, workload.context_sum) == (9, 7, 33 + 41 + 26)
    assert workload.mean_batch == pytest.approx(9 / 7)
    assert workload.mean_context == pytest.approx(100 / 9)


def test_roofline_by_hand():
    workload = decode_workload([([10, 20], [3, 2]), ([5], [4])])
    kv = kv_bytes_per_position(layers=2, kv_heads=2, head_dim=4, dtype_bytes=2)
    assert kv == 2 * 2 * 4 * 2 * 2 == 64
    # KV per step = 64 B x (100/9 positions) x (9/7 rows) = 6400/7 B; + 1000 B of weights = 13400/7 B per step;
    # at 13400 B/s a step takes 1/7 s and yields 9/7 tokens: 9 tokens/s
    r = roofline(workload, weight_bytes=1000, kv_per_position=kv, bandwidth=13400.0)
    assert r.kv_bytes_per_step == pytest.approx(6400 / 7)
    assert r.bytes_per_step == pytest.approx(13400 / 7)
    assert r.tokens_per_s == pytest.approx(9.0)
    assert "-> 9 sampled tokens/s" in format_roofline(r)
    assert format_achieved(r, achieved_tokens_per_s=4.5).endswith("= 50.0% of the roofline")
    unknown = roofline(workload, weight_bytes=1000, kv_per_position=kv, bandwidth=None)
    assert unknown.tokens_per_s is None
    assert format_roofline(unknown).endswith("peak bandwidth unknown for this device")
    assert format_achieved(unknown, achieved_tokens_per_s=4.5).endswith("(roofline unknown)")


@pytest.mark.parametrize(
    ("name", "bandwidth"),
    [
        ("NVIDIA H100 80GB HBM3", 3.35e12),
        ("NVIDIA H100 PCIe", 2.0e12),
        ("NVIDIA H200", 4.8e12),
        ("NVIDIA A100-SXM4-80GB", 2.0e12),
        ("NVIDIA A100-SXM4-40GB", 1.555e12),
        ("CPU (x86_64)", None),
    ],
)
def test_peak_bandwidth_by_device_name(name, bandwidth):
    assert peak_bandwidth(name) == bandwidth


@pytest.mark.parametrize("tied", [True, False])
def test_weight_bytes_read_counts_the_embedding_only_through_the_head(tied):
    config = transformers.Qwen2Config(
        vocab_size=10,
        hidden_size=4,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=tied,
    )
    model = transformers.Qwen2ForCausalLM(config).to(torch.float32)
    # head 10x4 = 40; layer: q 16+4, k 8+2, v 8+2, o 16, MLP 3x32, two norms 4+4; final norm 4 -> 204 parameters
    # read per token whether or not the head is tied (an untied embedding is a lookup); float32: 816 bytes
    assert weight_bytes_read(model) == 204 * 4
    r = model_roofline(model, decode_workload([([3], [2])]), "NVIDIA H100 80GB HBM3")
    # KV per position: 1 layer x 1 head x dim 2 x (K, V) x 4 bytes = 16; contexts 3 + 4 over 2 steps of 1 row
    assert r.kv_bytes_per_step == pytest.approx(16 * 3.5)
