"""transformers models on `kernels.gqa_attention`: grouped-query attention under a mask without key/value copies.

`folded_gqa(model)` switches a model whose attention is "sdpa" to `folded_sdpa_forward` for the calls inside it:
the cross-scorer's masked path and the engine's prefills and decode steps. transformers folds the query heads itself
for one-token decoding, but not inside `torch.compile`, where it falls back to the copies (a compiled decode step then
copied every layer's whole cache).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ragen_lit.kernels.gqa_attention import additive_mask, fold_gqa_attention, fold_mask

NAME = "ragen_folded_gqa"
# The sdpa kernels a masked attention may use (None: PyTorch's choice): "auto" is cuDNN's on Hopper, which builds
# an execution plan on the host for every new shape (tens of ms each); "efficient" is the memory-efficient kernel,
# which builds none (the math kernel where it is missing, e.g. on a CPU)
# (the names are `choices.MASKED_ATTENTION_KERNELS`)
MASKED_ATTENTION = {"auto": None, "efficient": [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]}


# Inside `folded_gqa`: the last mask folded and its fold. Every layer of a forward gets the same mask object, so it
# is folded once per forward instead of once per layer, and made additive once: sdpa converts a bool mask at every
# call, a pass over the whole [B, 1, G*T, S] mask per layer (and its plans and kernels read the result anyway);
# emptied when the context exits.
_last_fold: list[tuple[torch.Tensor, int, torch.dtype, torch.Tensor]] = []


def _folded(mask: torch.Tensor, groups: int, dtype: torch.dtype) -> torch.Tensor:
    if torch.compiler.is_compiling():  # a traced graph folds its own mask
        return fold_mask(mask, groups)
    if _last_fold and _last_fold[0][0] is mask and _last_fold[0][1:3] == (groups, dtype):
        return _last_fold[0][3]
    folded = additive_mask(fold_mask(mask, groups), dtype)
    _last_fold[:] = [(mask, groups, dtype, folded)]
    return folded


def folded_sdpa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
):
    """transformers' attention-function signature: `fold_gqa_attention` for grouped heads under a mask
    shared by the heads; every other call goes to transformers' own sdpa function unchanged."""
    groups = getattr(module, "num_key_value_groups", 1)
    if (
        groups == 1
        or attention_mask is None
        or attention_mask.dim() != 4
        or attention_mask.shape[1] != 1
        or kwargs.get("position_bias") is not None
        or kwargs.get("softcap") is not None
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    mask = _folded(attention_mask, groups, query.dtype)
    out = fold_gqa_attention(query, key, value, mask, dropout_p=dropout, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, folded_sdpa_forward)
AttentionMaskInterface.register(NAME, sdpa_mask)


@contextmanager
def folded_gqa(model: torch.nn.Module, kernel: str = "auto") -> Iterator[None]:
    """Inside: `model`'s sdpa attention runs `folded_sdpa_forward` (same results, no key/value copies), on the
    sdpa kernels `MASKED_ATTENTION[kernel]` allows. A model with another attention implementation is left as it
    is."""
    if kernel not in MASKED_ATTENTION:
        raise ValueError(f"attention must be one of {tuple(MASKED_ATTENTION)}, got {kernel!r}")
    backends = MASKED_ATTENTION[kernel]
    with sdpa_kernel(backends) if backends else contextlib.nullcontext():
        config = model.config
        if getattr(config, "_attn_implementation", None) != "sdpa":
            yield
            return
        config._attn_implementation = NAME
        try:
            yield
        finally:
            config._attn_implementation = "sdpa"
            _last_fold.clear()
