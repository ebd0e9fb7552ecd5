"""Model loading (`loaders`), the critic (`critic`), LoRA adapters (`lora`); `ragen_lit.presets` picks the folder."""

from ragen_lit.models.critic import Critic, load_critic
from ragen_lit.models.loaders import (
    DTYPES,
    TRANSFORMERS_RANGE,
    compile_layers,
    context_length,
    forward_cache_keyword,
    kv_heads_and_dim,
    layer_units,
    load_policy,
    load_tokenizer,
    resolve_compile,
    resolve_dtype,
    uses_gpu,
    warn_if_untested_transformers,
)
from ragen_lit.models.lora import apply_lora, linear_layer_names

__all__ = [
    "DTYPES",
    "TRANSFORMERS_RANGE",
    "Critic",
    "apply_lora",
    "compile_layers",
    "context_length",
    "forward_cache_keyword",
    "kv_heads_and_dim",
    "layer_units",
    "linear_layer_names",
    "load_critic",
    "load_policy",
    "load_tokenizer",
    "resolve_compile",
    "resolve_dtype",
    "uses_gpu",
    "warn_if_untested_transformers",
]
