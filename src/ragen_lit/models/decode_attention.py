"""One-token decode attention over a whole cache bucket, other than through sdpa's kernels.

At a decode step every row's one query token attends over its cache bucket (positions it may not see are masked
by an additive bias). On an H200, sdpa's cuDNN kernel read the cache at ~12-24% of the card's bandwidth in the
multi-turn bench, and its efficient and math kernels were slower (docs/PERFORMANCE.md, session 13). Two other
ways, each the same attention:

- "flex": FlexAttention (compiled, so on a GPU its Triton decoding kernel), the bias added by a `score_mod`.
  The G query heads that share a key/value head are folded into G query rows of that head, because the
  decoding kernel takes grouped heads only for power-of-two G (Qwen2.5-0.5B has 7);
- "matmul": two batched matrix products and a float32 softmax, with the folded rows: under `torch.compile`
  the bias and softmax fuse into one kernel beside the two GEMMs;
- "split": flash-decoding, the cache split into 128-position pieces attended in parallel and merged by their
  log partition sums, skipping the blocks the mask hides (`kernels.split_decode`'s Triton kernels, on CUDA; on
  other devices "matmul"'s attention).

`decode_attention(model, kernel)` switches a model's sdpa attention to one of them for the one-token calls
inside it (every other call runs `folded_sdpa_forward`, sdpa with the query heads folded).

Measured on an H200 (docs/PERFORMANCE.md, session 14): with the whole decode step compiled, "flex" decoded 6.5%
faster than the default in the engine alone (its kernel took 155 ms where cuDNN's took 354), but neither kernel
made the multi-turn bench's generation faster. "split" did (session 17): 618 against cuDNN's 1068 us per decode
step's 24 layers at a 1280-position cache, generation 2.04-2.22 against 2.25-2.26 s. It is an option, not the
default, as the engine's other options that change samples within rounding are.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.nn.attention.flex_attention import flex_attention
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ragen_lit.models.gqa_attention import folded_sdpa_forward

KERNELS = ("flex", "matmul", "split")


def _fold(query: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """`[B, H, 1, D]` -> `[B, H_kv, G, D]`: row g of key/value head k is query head k*G + g."""
    batch, heads, _, dim = query.shape
    return query.reshape(batch, kv_heads, heads // kv_heads, dim)


@functools.cache
def _compiled_flex():
    return torch.compile(flex_attention)


def flex_decode(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """softmax(q k^T * scale + bias) v for `query: [B, H, 1, D]` over `key`, `value: [B, H_kv, S, D]` (query head h
    reads key head h // G), `bias: [B, S]` added to every head's scores (0 to attend, a large negative not to).
    FlexAttention, compiled unless already inside a compiled region. Returns `[B, H, 1, D]`."""
    rows = _fold(query, key.shape[1])

    def add_bias(score, b, h, q_idx, kv_idx):
        return score + bias[b, kv_idx]

    attend = flex_attention if torch.compiler.is_compiling() else _compiled_flex()
    return attend(rows, key, value, score_mod=add_bias, scale=scale).reshape(query.shape)


def matmul_decode(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """`flex_decode`'s attention as two batched matrix products and a float32 softmax."""
    rows = _fold(query, key.shape[1])
    scale = rows.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(rows, key.transpose(-1, -2)).float() * scale + bias[:, None, None, :].float()
    weights = torch.softmax(scores, dim=-1).to(value.dtype)
    return torch.matmul(weights, value).reshape(query.shape)


@torch.library.custom_op("ragen_lit::split_decode", mutates_args=())
def _split_decode_op(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor, scale: float
) -> torch.Tensor:
    """`kernels.split_decode.split_decode` as one opaque operator: a compiled decode step (`rollout.hf_compile_decode`)
    calls the Triton kernels instead of tracing into them."""
    from ragen_lit.kernels.split_decode import split_decode as triton_split_decode  # Triton: CUDA machines only

    return triton_split_decode(query, key, value, bias, scale)


@_split_decode_op.register_fake
def _(query, key, value, bias, scale):
    return query.new_empty(query.shape)


def split_decode(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """`flex_decode`'s attention split along the keys (`kernels.split_decode`) on CUDA; `matmul_decode` elsewhere."""
    if not query.is_cuda:
        return matmul_decode(query, key, value, bias, scale)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    return _split_decode_op(query, key, value, bias, float(scale))


_KERNEL_FUNCTIONS = {"flex": flex_decode, "matmul": matmul_decode, "split": split_decode}


def _forward(
    kernel: str,
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
):
    """transformers' attention-function signature: a one-token query under a `[B, 1, 1, S]` mask runs `kernel`;
    every other call `folded_sdpa_forward`."""
    if (
        query.shape[2] != 1
        or attention_mask is None
        or attention_mask.dim() != 4
        or attention_mask.shape[1:3] != (1, 1)
        or attention_mask.dtype == torch.bool
        or dropout
        or kwargs.get("position_bias") is not None
        or kwargs.get("softcap") is not None
    ):
        return folded_sdpa_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    bias = attention_mask[:, 0, 0, :].expand(query.shape[0], -1)
    out = _KERNEL_FUNCTIONS[kernel](query, key, value, bias, scaling)
    return out.transpose(1, 2).contiguous(), None


def _name(kernel: str) -> str:
    return f"ragen_decode_{kernel}"


for _kernel in KERNELS:
    AttentionInterface.register(_name(_kernel), functools.partial(_forward, _kernel))
    AttentionMaskInterface.register(_name(_kernel), sdpa_mask)


@contextmanager
def decode_attention(model: torch.nn.Module, kernel: str) -> Iterator[None]:
    """Inside: `model`'s sdpa attention runs `kernel` (a `KERNELS` name) for one-token queries. A model with another
    attention implementation is left as it is."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    config = model.config
    if getattr(config, "_attn_implementation", None) != "sdpa":
        yield
        return
    config._attn_implementation = _name(kernel)
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"
