"""A 2-layer random Qwen2 (vocabulary 64, hidden 16, one KV head) that model-level tests build in milliseconds."""

from __future__ import annotations

import torch
import transformers


def tiny_qwen2(seed: int = 0, tie: bool = True) -> transformers.Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
    )
    return transformers.Qwen2ForCausalLM(config).float()
