"""Token log-probabilities of a causal LM: the one implementation behind every use.

Training (the policy-gradient ratio and the entropy bonus), the old-policy and reference passes, and
the MI cross-scorer (docs/METHOD.md §3, `L_sum[r, j] = Σ_t log p(z_{r,t} | x_j, z_{r,<t})`) all call
`token_logprobs`. It runs the backbone once and then applies the vocabulary head chunk by chunk, so
that full-vocabulary fp32 logits never exist for the whole batch: at most `max_tokens_per_chunk`
positions × vocabulary at a time. Under autograd each chunk is checkpointed, so backward keeps only
the hidden states and recomputes one chunk's logits at a time.

Padding-free decoding (`packed=True`, `pack_rows`): the rows' real tokens run through the decoder end to
end as one sequence, positions restarting at 0 on each row; transformers reads the restarts as packed
sequences and builds a block-diagonal causal mask (a FlexAttention block mask under
`attn_implementation="flex_attention"`, a dense bool mask under sdpa/eager), so no work goes to padding
and the results equal the padded forward's.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ragen_lit.kernels import triton_runs_on

# Config fields of HF models whose forward transforms the head's output before the softmax; the
# chunked head here applies the plain linear head only, so such models are refused, not mis-scored.
_LOGIT_TRANSFORM_FIELDS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


class HostMasks:
    """CPU copies of a batch's `attention_mask` [B, T] and, optionally, `score_mask` [B, T] (a micro-batch's:
    `training.batch.micro_batches`): the padding layout and the scored positions are read from them without the host
    waiting for the device.

    A plain class on purpose: FSDP2's root module (like DDP) copies every tensor it finds in a forward's arguments to
    its GPU before the forward, looking into tuples, lists, dicts and named tuples, and passes any other object as it
    is. Copies of the masks in a tuple would reach the scorer on the GPU."""

    __slots__ = ("attention_mask", "score_mask")

    def __init__(self, attention_mask: Tensor, score_mask: Tensor | None = None):
        self.attention_mask = attention_mask
        self.score_mask = score_mask


class LogProbs(NamedTuple):
    """`logprobs[b, t] = log p(input_ids[b, t] | input_ids[b, <t])` ([B, T] float32) and, if asked,
    the entropy of that same next-token distribution ([B, T] float32); both 0 where not scored."""

    logprobs: Tensor
    entropy: Tensor | None


def default_position_ids(attention_mask: Tensor) -> Tensor:
    """Positions counted over real tokens only: `cumsum(mask) − 1`, clamped at 0 ([B, T] long).

    Gives `arange` for right padding and shifts left-padded rows so their first real token is 0."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def on_device(host: Tensor, device: torch.device) -> Tensor:
    """A CPU tensor copied to `device` without the host waiting for the device's queued work (pinned memory,
    a non-blocking copy on a GPU)."""
    if device.type == "cpu":
        return host
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


def host_tensor_on(values, device: torch.device, dtype: torch.dtype = torch.long) -> Tensor:
    """`torch.tensor(values, dtype=dtype)` made on the host and sent to `device` without waiting for it (`on_device`):
    `torch.tensor(..., device=...)` copies from pageable memory and then waits for everything queued on the device,
    which leaves it idle while the host prepares what comes next."""
    return on_device(torch.tensor(values, dtype=dtype), device)


def scored_positions(
    attention_mask: Tensor, score_mask: Tensor | None = None, *, device: torch.device | None = None
) -> tuple[Tensor, Tensor]:
    """`(rows, prev)` [M] long: the positions t-1 whose next token t is scored (tokens t-1 and t real, and
    `score_mask[:, t]` if given), row-major. Masks on the CPU (a micro-batch's host copies) are read there and the
    result is sent to `device` without waiting for it; masks on a device make the host wait for that device
    (`nonzero`)."""
    scored = attention_mask[:, 1:].bool() & attention_mask[:, :-1].bool()  # [B, T-1]
    if score_mask is not None:
        scored = scored & score_mask[:, 1:].bool()
    rows, prev = scored.nonzero(as_tuple=True)
    if device is not None and rows.device != device:
        rows, prev = on_device(rows, device), on_device(prev, device)
    return rows, prev


def _holes(attention_mask: Tensor) -> bool:
    """Whether a real token follows a padding position in some row (left padding, holes)."""
    mask = attention_mask.bool()
    return bool((mask[:, 1:] & ~mask[:, :-1]).any())


def decoder_inputs(attention_mask: Tensor, host_mask: Tensor | None = None) -> tuple[Tensor | None, Tensor]:
    """The attention mask and position ids a decoder without a KV cache needs for `attention_mask` [B, T].

    Right-padded rows (every row's real tokens are a prefix) need no mask: under causal attention a real
    token only sees earlier real tokens, so the decoder runs plain causal attention (flash/cuDNN causal
    kernels, grouped-query attention without copying K/V, no [B, 1, T, T] mask). Their positions are then
    `arange(T)` for every row, counting on through the padding: positions that stop at the padding (as
    `default_position_ids` gives) make transformers read each row as several packed sequences and build
    the dense mask after all. Other padding: the mask itself and `default_position_ids`. Outputs at
    padding positions differ between the two forms and are never used. `host_mask`: the same mask on the CPU,
    which the padding check then reads instead of waiting for the device.
    """
    if _holes(attention_mask if host_mask is None else host_mask):
        return attention_mask.long(), default_position_ids(attention_mask)
    batch, length = attention_mask.shape
    return None, torch.arange(length, device=attention_mask.device).expand(batch, length)


class PackedRows(NamedTuple):
    """The real tokens of a [B, T] batch laid end to end as one sequence of N tokens, row after row."""

    input_ids: Tensor
    """[1, N] long: every row's real tokens, in order"""
    position_ids: Tensor
    """[1, N] long: each token's position in its own row (restarting at 0 on every row)"""
    index: Tensor
    """[B, T] long: where each real token of the batch sits in the packed sequence (0 at padding: never read)"""


def pack_rows(input_ids: Tensor, attention_mask: Tensor, host_mask: Tensor | None = None) -> PackedRows:
    """`input_ids` [B, T] without their padding (`attention_mask` [B, T], any padding side, holes too).

    Positions count real tokens only (`default_position_ids`), as the padded forward gives them, so a
    decoder sees every row exactly as in the padded batch. A row starts where the position falls back to
    0, which is how transformers (`masking_utils.find_packed_sequence_indices`) splits a packed sequence
    given `position_ids` and no attention mask. `host_mask`: the same mask on the CPU, where the real tokens are
    then found (otherwise the host waits for the device)."""
    mask = attention_mask.bool()
    if host_mask is None:
        real = mask.flatten().nonzero().squeeze(1)  # the one wait for the device
    else:
        real = on_device(host_mask.bool().flatten().nonzero().squeeze(1), mask.device)
    index = (mask.flatten().long().cumsum(0) - 1).clamp(min=0).view(mask.shape)
    return PackedRows(input_ids.flatten()[real][None], default_position_ids(mask).flatten()[real][None], index)


def token_logprobs(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    max_tokens_per_chunk: int = 4096,
    position_ids: Tensor | None = None,
    score_mask: Tensor | None = None,
    cache: Any = None,
    cache_mask: Tensor | None = None,
    compile_head: bool = False,
    packed: bool = False,
    host_masks: HostMasks | None = None,
) -> LogProbs:
    """Log-probability (and optionally entropy) of every token given its prefix, chunked over the head.

    Args:
        model: any HF causal LM (`get_decoder()` gives the backbone, `get_output_embeddings()` the head).
        input_ids: [B, T] long.
        attention_mask: [B, T] bool or 0/1 ints; right or left padding.
        temperature: logits are divided by it before the log-softmax (sampling temperature).
        with_entropy: also return the entropy of each next-token distribution.
        max_tokens_per_chunk: most token positions whose full-vocabulary logits exist at once.
        position_ids: [B, T] long; default: `decoder_inputs(attention_mask)`'s, or with a `cache`
            `default_position_ids` continuing after each row's real cached tokens.
        score_mask: [B, T] bool, optional: score only these target positions (e.g. the response
            tokens), which saves the head's work on the rest; they come back as 0.
        cache: optional HF KV cache (`transformers.Cache`, batch size B or empty) of prefixes that the
            rows continue; the forward extends it in place. `attention_mask` covers `input_ids` only.
            Position 0 of `input_ids` is still not scored (use the prefix's last token as `input_ids[:, 0]`
            to score the first continuation token). See `cache_keyword`.
        cache_mask: [B, cached length] bool, optional: which cached positions each row attends to
            (default all). `position_ids` default to continuing after each row's real cached tokens.
        compile_head: run each head chunk through `torch.compile` (dynamic shapes): the fp32
            log-softmax, gather and entropy fuse into a few kernels instead of materialising several
            fp32 [chunk, V] tensors (`model.compile`).
        packed: run the decoder padding-free on `pack_rows(input_ids, attention_mask)` (one sequence of the
            rows' real tokens; `optim.padding_free`). Same results; not with `cache` or `position_ids`.
        host_masks: CPU copies of `attention_mask` and `score_mask` (`HostMasks`): the scored positions and the
            padding layout are then found on the host, and the call does not wait for the device (otherwise it does,
            before the decoder runs). Same results.

    Returns:
        `LogProbs` of [B, T] float32 tensors. Position t is scored when tokens t and t−1 are both real
        (and `score_mask[:, t]`, if given): position 0, padding and, with left padding, the first real
        token (which has no real prefix) are 0.
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [B, T], got shape {tuple(input_ids.shape)}")
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask shape {tuple(attention_mask.shape)} must equal input_ids shape {tuple(input_ids.shape)}"
        )
    if score_mask is not None and score_mask.shape != input_ids.shape:
        raise ValueError(
            f"score_mask shape {tuple(score_mask.shape)} must equal input_ids shape {tuple(input_ids.shape)}"
        )
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if max_tokens_per_chunk < 1:
        raise ValueError(f"max_tokens_per_chunk must be >= 1, got {max_tokens_per_chunk}")
    if packed and (cache is not None or position_ids is not None):
        raise ValueError("packed=True takes neither a cache nor position_ids: the rows' own positions are used")
    decoder, head = _backbone_and_head(model)

    attention_mask = attention_mask.bool()
    host_mask, host_score_mask = (
        (None, None) if host_masks is None else (host_masks.attention_mask, host_masks.score_mask)
    )
    if host_mask is not None and (host_mask.shape != input_ids.shape or host_mask.device.type != "cpu"):
        raise ValueError(
            f"host_masks must be CPU copies of the [B, T] masks, got {host_mask.device} {tuple(host_mask.shape)}"
        )
    if packed:
        rows_end_to_end = pack_rows(input_ids, attention_mask, host_mask)
        decoder_kwargs = {"input_ids": rows_end_to_end.input_ids, "position_ids": rows_end_to_end.position_ids}
    elif cache is None:
        decoder_mask, positions = decoder_inputs(attention_mask, host_mask)
        decoder_kwargs = {"input_ids": input_ids, "attention_mask": decoder_mask, "position_ids": positions}
    else:
        keyword = cache_keyword(model)
        if keyword is None:
            raise ValueError(f"model {type(model).__name__}'s decoder takes no KV cache argument")
        if cache_mask is None:
            cache_mask = attention_mask.new_ones(input_ids.shape[0], cache.get_seq_length())
        past = cache_mask.long().sum(-1, keepdim=True)  # real cached tokens per row
        decoder_kwargs = {
            "input_ids": input_ids,
            "attention_mask": torch.cat([cache_mask.long(), attention_mask.long()], dim=1),
            "position_ids": default_position_ids(attention_mask) + past,
            keyword: cache,
        }
    if position_ids is not None:
        decoder_kwargs["position_ids"] = position_ids
    # Token t is predicted from the hidden state at t-1, so both must be real tokens. (Found before the decoder
    # runs: without host masks `nonzero` waits for the device, which then has only earlier work queued.)
    if host_mask is None:
        rows, prev = scored_positions(attention_mask, score_mask)
    else:
        rows, prev = scored_positions(host_mask, host_score_mask, device=input_ids.device)
    hidden = decoder(**decoder_kwargs, use_cache=cache is not None).last_hidden_state  # [B, T, H]; packed [1, N, H]
    states = hidden[0, rows_end_to_end.index[rows, prev]] if packed else hidden[rows, prev]  # [M, H]
    targets = input_ids[rows, prev + 1]  # [M]

    needs_grad = torch.is_grad_enabled() and (states.requires_grad or any(p.requires_grad for p in head.parameters()))
    if not needs_grad and not with_entropy and triton_runs_on(states.device):
        head_fn = _kernel_head_logprobs  # the logits read once (`kernels.logprob`)
    else:
        head_fn = _compiled_head_logprobs() if compile_head else _head_logprobs
    pieces = []
    for start in range(0, targets.numel(), max_tokens_per_chunk):
        stop = start + max_tokens_per_chunk
        chunk = (head, states[start:stop], targets[start:stop], temperature, with_entropy)
        if needs_grad:
            pieces.append(checkpoint(head_fn, *chunk, use_reentrant=False))
        else:
            pieces.append(head_fn(*chunk))

    batch, length = input_ids.shape
    where = (rows, prev + 1)

    def scatter(values: list[Tensor]) -> Tensor:
        flat = torch.cat(values) if values else hidden.new_zeros(0, dtype=torch.float32)
        return hidden.new_zeros(batch, length, dtype=torch.float32).index_put(where, flat)

    logprobs = scatter([piece[0] for piece in pieces])
    entropy = scatter([piece[1] for piece in pieces]) if with_entropy else None
    return LogProbs(logprobs, entropy)


def cache_keyword(model: torch.nn.Module) -> str | None:
    """The keyword under which the model's decoder takes a KV cache (`cache` in recent transformers 5.x,
    `past_key_values` before), or None when its forward takes neither."""
    decoder, _ = _backbone_and_head(model)
    try:
        parameters = inspect.signature(decoder.forward).parameters
    except (TypeError, ValueError):
        return None
    return next((name for name in ("cache", "past_key_values") if name in parameters), None)


def _head_logprobs(
    head: torch.nn.Module, states: Tensor, targets: Tensor, temperature: float, with_entropy: bool
) -> tuple[Tensor, ...]:
    """Head + fp32 log-softmax on one chunk: (target log-prob [M], entropy [M] if asked)."""
    logits = head(states).float()
    if temperature != 1.0:
        logits = logits / temperature
    log_probs = logits.log_softmax(-1)  # [M, V]
    target_logprobs = log_probs.gather(-1, targets[:, None]).squeeze(-1)
    if not with_entropy:
        return (target_logprobs,)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return target_logprobs, entropy


def _kernel_head_logprobs(
    head: torch.nn.Module, states: Tensor, targets: Tensor, temperature: float, with_entropy: bool
) -> tuple[Tensor]:
    """`_head_logprobs` without entropy through the Triton kernels of `kernels.logprob`: the head's
    logits in their own dtype, read once, no float32 [M, V] tensor."""
    from ragen_lit.kernels.logprob import target_logprobs

    assert not with_entropy
    return (target_logprobs(head(states), targets, temperature),)


@functools.cache
def _compiled_head_logprobs():
    """`_head_logprobs` under `torch.compile` (made on first use; one dynamic-shape graph per mode)."""
    return torch.compile(_head_logprobs, dynamic=True)


def _backbone_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The model's decoder stack (hidden states after the final norm) and its vocabulary head."""
    config = getattr(model, "config", None)
    for field in _LOGIT_TRANSFORM_FIELDS:
        if getattr(config, field, None) not in (None, 1, 1.0):
            raise ValueError(
                f"model config sets {field}={getattr(config, field)!r}; token_logprobs supports causal LMs "
                "whose logits are the plain output-embedding projection"
            )
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else getattr(model, "lm_head", None)
    if decoder is None or decoder is model or head is None:
        raise ValueError(
            f"model {type(model).__name__} must be a causal LM with a separate decoder (get_decoder()/.model) "
            "and vocabulary head (get_output_embeddings()/.lm_head)"
        )
    return decoder, head


def mean_abs_logprob_diff(sample_logprobs: torch.Tensor, trainer_logprobs: torch.Tensor, mask: torch.Tensor) -> float:
    """Training-vs-sampling mismatch: mean |log π_sample(y_t) − log π_train(y_t)| over masked tokens.

    `sample_logprobs`, `trainer_logprobs`: [B, T] float (the engine's sampling log-probs and the
    trainer's old-policy log-probs of the same tokens); `mask: [B, T] bool` (the response tokens).
    Returns 0.0 when the mask selects no token.
    """
    if sample_logprobs.shape != trainer_logprobs.shape or mask.shape != sample_logprobs.shape:
        raise ValueError(
            "sample_logprobs, trainer_logprobs and mask must have one shape, got "
            f"{tuple(sample_logprobs.shape)}, {tuple(trainer_logprobs.shape)}, {tuple(mask.shape)}"
        )
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor, got {mask.dtype}")
    if not bool(mask.any()):
        return 0.0
    diff = (sample_logprobs.double() - trainer_logprobs.double()).abs()
    return float(diff[mask].mean())
