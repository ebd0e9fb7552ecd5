"""transformers models on flash-decoding: the graph cache's one-token decode steps through `kernels.split_decode`.

At a decode step every row's one query token attends over its cache bucket (positions it may not see are masked by
an additive bias). sdpa gives each (row, key/value head) one program that walks the whole bucket; the split kernels
read the cache in parallel pieces and skip the blocks the mask hides. `split_decode_attention(model)` switches a
model's sdpa attention to them for the one-token calls inside it, where Triton runs (CUDA); every other call runs
`folded_sdpa_forward` (sdpa with the query heads folded), and so does every call elsewhere. The same attention up to
rounding.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ragen_lit.kernels import triton_runs_on
from ragen_lit.models.gqa_attention import folded_gqa, folded_sdpa_forward

NAME = "ragen_split_decode"


@torch.library.custom_op("ragen_lit::split_decode", mutates_args=())
def _split_decode_op(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor, scale: float
) -> torch.Tensor:
    """`kernels.split_decode.split_decode` as one opaque operator: a compiled decode step calls the Triton kernels
    instead of tracing into them."""
    from ragen_lit.kernels.split_decode import split_decode  # Triton: imported where it runs

    return split_decode(query, key, value, bias, scale)


@_split_decode_op.register_fake
def _(query, key, value, bias, scale):
    return query.new_empty(query.shape)


def split_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
):
    """transformers' attention-function signature: a one-token query under a `[B, 1, 1, S]` additive mask goes to the
    split kernels; every other call to `folded_sdpa_forward`."""
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
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    out = _split_decode_op(query, key, value, bias, float(scale))
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, split_forward)
AttentionMaskInterface.register(NAME, sdpa_mask)


@contextmanager
def split_decode_attention(model: torch.nn.Module) -> Iterator[None]:
    """Inside: `model`'s sdpa attention runs `split_forward` where Triton runs on the model's device (decided here,
    outside any compiled region), else `folded_gqa`'s. A model with another attention implementation is left as it
    is."""
    config = model.config
    if not triton_runs_on(next(model.parameters()).device):
        with folded_gqa(model):
            yield
        return
    if getattr(config, "_attn_implementation", None) != "sdpa":
        yield
        return
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"
