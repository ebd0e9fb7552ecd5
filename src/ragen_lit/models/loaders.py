"""Loading the policy and its tokenizer from a folder or hub id, and the per-layer helpers that
sharding and compilation use. One code path for every model: a preset (`ragen_lit.presets`) only
decides *which folder* to load; loading is always `from_pretrained`.
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import logging
import re
import sys
import types

import torch
from torch import nn

from ragen_lit.choices import DTYPE_NAMES
from ragen_lit.errors import ConfigError
from ragen_lit.logprobs import cache_keyword

log = logging.getLogger(__name__)

# The transformers versions CI runs the end-to-end tests under: the floor (.ci/floors_env.sh) and the
# newest release below the ceiling (scripts/setup.sh); pyproject.toml declares exactly this range
# (tests/models/test_loaders.py checks). Below 5.4 the fixed-shape decode has no on-device cache
# position; from 5.24 a model takes its KV cache as `cache=`, before as `past_key_values=`.
TRANSFORMERS_RANGE = ("5.4", "5.30")  # (lowest, first excluded), as major.minor

# The one name -> dtype mapping; each place that takes a dtype name accepts these or a subset of them
# (vLLM adds "auto", `diagnose` only float32/bfloat16, `model.dtype` adds "auto").
DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}


def uses_gpu(accelerator: str) -> bool:
    """Whether a run computes on a GPU: `trainer.accelerator` is not `cpu` and CUDA is present (what the settings
    that resolve "auto" by the hardware follow; a machine with a GPU told to use the CPU counts as a CPU)."""
    return accelerator != "cpu" and torch.cuda.is_available()


def resolve_dtype(name: str, accelerator: str = "auto") -> torch.dtype:
    """`auto`: bfloat16 where a GPU is used (`uses_gpu`), float32 on CPU (CPUs without native bf16 matrix units run
    bf16 matmuls several times slower than fp32)."""
    if name == "auto":
        return torch.bfloat16 if uses_gpu(accelerator) else torch.float32
    return DTYPES[name]


def resolve_compile(setting: bool | None, accelerator: str = "auto") -> bool:
    """`model.compile`: the setting, or for null (auto) whether a GPU is used (`uses_gpu`)."""
    return uses_gpu(accelerator) if setting is None else setting


def _major_minor(version: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else (0, 0)


def untested_transformers_message(installed: str) -> str | None:
    """The one warning line for transformers `installed` outside `TRANSFORMERS_RANGE`, else None."""
    lowest, excluded = TRANSFORMERS_RANGE
    if _major_minor(lowest) <= _major_minor(installed) < _major_minor(excluded):
        return None
    return (
        f"transformers {installed} is installed; ragen_lit is tested with transformers>={lowest},<{excluded} "
        "(generation may go wrong without an error)"
    )


def installed_transformers() -> str:
    return importlib.metadata.version("transformers")


@functools.cache
def warn_if_untested_transformers() -> bool:
    """Warn once per process when the installed transformers is outside the tested range: an untested
    version can change generation silently (under 5.17 the engine's `cache=` keyword was swallowed and
    every token decoded without its context). Returns whether it warned."""
    message = untested_transformers_message(installed_transformers())
    if message is not None:
        log.warning(message)
    return message is not None


def load_tokenizer(path: str, chat_template: str | None = None):
    """The tokenizer of `path`, a pad token set (its end-of-sequence token where it has none); `chat_template`, a
    Jinja text (`config.chat_templates.chat_template_source`), replaces its own chat template."""
    from transformers import AutoTokenizer

    warn_if_untested_transformers()

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise ConfigError(f"model.path={path!r}: cannot load a tokenizer there ({str(err).splitlines()[0]})") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


def attention_kwargs(attention: str) -> dict:
    """`from_pretrained` keywords for an `ATTENTION_IMPLEMENTATIONS` name (none for auto)."""
    return {} if attention == "auto" else {"attn_implementation": attention}


def load_policy(path: str, dtype: str, attention: str = "auto", accelerator: str = "auto") -> nn.Module:
    from transformers import AutoModelForCausalLM

    warn_if_untested_transformers()

    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=resolve_dtype(dtype, accelerator), **attention_kwargs(attention)
        )
    except (OSError, ValueError) as err:
        raise ConfigError(f"model.path={path!r}: cannot load a causal LM there ({str(err).splitlines()[0]})") from None
    model.config.use_cache = False
    return model


def forward_cache_keyword(model: torch.nn.Module) -> str:
    """The keyword `model(...)` takes its KV cache under: `cache` from transformers 5.24, `past_key_values`
    before (an unknown keyword is swallowed by `**kwargs`, so the name must be right). Read from the
    model's own forward, else from its decoder's (wrappers such as PEFT pass `**kwargs` through), else
    transformers' current name."""
    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        parameters = {}
    for name in ("cache", "past_key_values"):
        if name in parameters:
            return name
    try:
        return cache_keyword(model) or "cache"
    except ValueError:  # not a causal LM with a separate decoder
        return "cache"


def kv_heads_and_dim(config) -> tuple[int, int]:
    """(key/value heads, head dimension) of a transformers config's decoder; configs without
    `num_key_value_heads` or `head_dim` mean full multi-head attention over `hidden_size / heads`."""
    text = config.get_text_config(decoder=True)
    heads = text.num_attention_heads
    return getattr(text, "num_key_value_heads", None) or heads, getattr(
        text, "head_dim", None
    ) or text.hidden_size // heads


def context_length(config) -> int | None:
    """The most positions the decoder of a transformers config was built for (`max_position_embeddings`, GPT-2's
    `n_positions`), or None where the config states none."""
    text = config.get_text_config(decoder=True)
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(text, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


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
    training calls eager too) runs the eager forward, but the block's cache-free parts inside it, its
    normalisations and its MLP (`_cache_free_parts`), run compiled too: a decode step of a 0.5B model at
    batch 128 is bound by its ~45 small kernels per layer (docs/PERFORMANCE.md), 8 of them per
    RMSNorm, which fuse into one; so does its attention's rotary embedding (`_with_compiled_rotary`). The
    dispatchers are bound to each module, so module hooks (FSDP's all-gather
    and reshard) still run eagerly around them, and a deep copy of the model binds the copy's own modules.
    """
    units = layer_units(model)
    if not units:
        raise ConfigError(
            f"model.compile=true: {type(model).__name__} lists no repeated layer classes (_no_split_modules) to compile"
        )
    dispatchers: dict[type, object] = {}
    for unit in units:
        cls = type(unit)
        if cls not in dispatchers:
            dispatchers[cls] = _cache_free_compiled(cls.forward)
        unit.forward = types.MethodType(dispatchers[cls], unit)
        for part in _cache_free_parts(unit):
            kind = type(part)
            if kind not in dispatchers:
                dispatchers[kind] = _compiled_outside_compilation(kind.forward)
            part.forward = types.MethodType(dispatchers[kind], part)
        for attention in _rotary_attentions(unit):
            kind = type(attention)
            if kind not in dispatchers:
                dispatchers[kind] = _with_compiled_rotary(kind.forward, sys.modules[kind.__module__])
            attention.forward = types.MethodType(dispatchers[kind], attention)


def _cache_free_parts(unit: nn.Module) -> list[nn.Module]:
    """The modules inside a block that never touch a KV cache and take one tensor: its normalisations
    (`…Norm`, e.g. `Qwen2RMSNorm`, Qwen3's per-head q/k norms) and its feed-forward (`…MLP`)."""
    return [m for m in unit.modules() if m is not unit and type(m).__name__.endswith(("Norm", "MLP"))]


def _rotary_attentions(unit: nn.Module) -> list[nn.Module]:
    """The attention modules inside a block whose model code rotates queries and keys with a module-level
    `apply_rotary_pos_emb` (transformers' Llama, Qwen2, Qwen3, Mistral, … classes)."""
    return [
        m
        for m in unit.modules()
        if type(m).__name__.endswith("Attention")
        and callable(getattr(sys.modules.get(type(m).__module__), "apply_rotary_pos_emb", None))
    ]


def _with_compiled_rotary(forward, namespace):
    """`forward` of an attention module, with its model code's `apply_rotary_pos_emb` compiled (dynamic shapes)
    for the call where the attention runs eagerly (the cache calls: decode steps, prefills, cross-scoring): the
    rotary embedding's ~10 element-wise kernels per layer (multiplications, negation, concatenation, sums) fuse
    into one or two. The module's global is switched for the call only, so other models keep theirs; inside an
    enclosing compilation `forward` runs as written."""
    original = namespace.apply_rotary_pos_emb
    compiled = torch.compile(original, dynamic=True)

    def dispatch(self, *args, **kwargs):
        if torch.compiler.is_compiling():
            return forward(self, *args, **kwargs)
        namespace.apply_rotary_pos_emb = compiled
        try:
            return forward(self, *args, **kwargs)
        finally:
            namespace.apply_rotary_pos_emb = original

    return dispatch


def _compiled_outside_compilation(forward):
    """`forward` compiled (dynamic shapes) where it is called eagerly; traced as written where an enclosing
    compiled block is being compiled (no compiled call nested in another's graph)."""
    compiled = torch.compile(forward, dynamic=True)

    def dispatch(self, *args, **kwargs):
        if torch.compiler.is_compiling():
            return forward(self, *args, **kwargs)
        return compiled(self, *args, **kwargs)

    return dispatch


def _cache_free_compiled(forward):
    """`forward` compiled for calls without a KV cache, eager for calls with one."""
    compiled = torch.compile(forward, dynamic=True)

    def dispatch(self, *args, **kwargs):
        if kwargs.get("cache") is not None or kwargs.get("past_key_values") is not None:
            return forward(self, *args, **kwargs)
        return compiled(self, *args, **kwargs)

    return dispatch
