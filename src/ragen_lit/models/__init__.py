"""Model loading (`loaders`) and the critic (`critic`); which folder to load is `ragen_lit.presets`'s job."""

from ragen_lit.models.critic import Critic, load_critic
from ragen_lit.models.loaders import (
    ATTENTION_IMPLEMENTATIONS,
    DTYPES,
    TRANSFORMERS_RANGE,
    compile_layers,
    context_length,
    forward_cache_keyword,
    kv_heads_and_dim,
    layer_units,
    load_policy,
    load_tokenizer,
    resolve_dtype,
    warn_if_untested_transformers,
)

__all__ = [
    "ATTENTION_IMPLEMENTATIONS",
    "DTYPES",
    "TRANSFORMERS_RANGE",
    "Critic",
    "compile_layers",
    "context_length",
    "forward_cache_keyword",
    "kv_heads_and_dim",
    "layer_units",
    "load_critic",
    "load_policy",
    "load_tokenizer",
    "resolve_dtype",
    "warn_if_untested_transformers",
]
