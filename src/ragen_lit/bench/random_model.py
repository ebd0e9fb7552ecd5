"""The random-init Qwen2 that the GPU benchmarks measure (and `scripts/make_random_model.py` writes): the
Qwen2.5-0.5B shape, or a tiny one for --smoke, saved with the env-text tokenizer of the built-in tiny model
(no hub access needed)."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from ragen_lit.bench.common import progress
from ragen_lit.presets.tiny.build import TinyRecipe, tokenizer_corpus
from ragen_lit.presets.tiny.tokenizer import train_tokenizer

# Qwen2.5-0.5B's shape
QWEN_0_5B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
    "rope_theta": 1e6,
}


def qwen_config(tokenizer, smoke: bool) -> transformers.Qwen2Config:
    """Qwen2.5-0.5B's shape (random init), or a tiny one with the tokenizer's vocabulary for --smoke."""
    ids = {
        "bos_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if smoke:
        return transformers.Qwen2Config(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=len(tokenizer),
            tie_word_embeddings=True,
            max_position_embeddings=4096,
            **ids,
        )
    return transformers.Qwen2Config(**QWEN_0_5B, **ids)


def write_random_model(folder: Path, smoke: bool, device: torch.device) -> transformers.Qwen2Config:
    """Save a random-init Qwen2 (bf16) and the env-text tokenizer to `folder`; returns the model config."""
    tokenizer = train_tokenizer(tokenizer_corpus(TinyRecipe()), TinyRecipe().vocab_size)
    config = qwen_config(tokenizer, smoke)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.Qwen2ForCausalLM(config)
    progress(f"random {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M-parameter Qwen2 initialised on {device}")
    model.to(torch.bfloat16).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return config
