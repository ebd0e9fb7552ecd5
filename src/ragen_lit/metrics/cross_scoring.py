"""In-batch cross-scoring: the score matrices that the MI proxies are computed from (docs/METHOD.md §3).

For R reasoning samples z_r and N prompts x_j, with the model teacher-forced on `[x_j | z_r]`:
`L_sum[r, j] = Σ_t log p(z_{r,t} | x_j, z_{r,<t})` and `L_tok[r, j] = L_sum[r, j] / |z_r|`.

Method (exact, no approximation): deduplication plus prefix KV caching (`masked_scoring`). Token-identical prompts (and
reasonings) are scored once and their column (row) copied. Each distinct prompt is then encoded once: its
first P−1 tokens go through the backbone into a KV cache (prompts of similar lengths batched together), and
every reasoning is scored against that cache, each row fed as `[x_{P−1} | z_r]` (the prompt's last token,
whose hidden state predicts z_{r,1}) with positions continuing after the prefix and the prefix's keys/values
gathered along the batch (rows of several prompts share a forward, shorter prefixes masked) straight into a
static cache with room for the rows' own tokens, which the forward writes in place (one copy of each row's
prefix, none appended on top of it). Prompts are long multi-turn contexts and reasonings short, so this avoids
re-encoding every prompt R times. Log-probs come from `ragen_lit.logprobs.token_logprobs` (given the cache),
so the vocabulary head runs on at most `max_tokens_per_chunk` positions at a time. Models whose decoder takes
no KV cache, or whose cache is not plain full-attention `DynamicLayer`s (sliding-window, linear attention, …),
fall back to packing every distinct `[x_j | z_r]` pair into full forwards. With `attention="varlen"`
(`diagnostics.attention`'s default) nothing is gathered or padded: a group's prefixes run as one packed sequence,
and every forward packs its rows' real tokens end to end, each row attending over its own tokens and its prompt's
packed prefix through variable-length attention merged by log-sum-exp (`packed_scoring`). Otherwise
attention runs under `models.gqa_attention.folded_gqa` (grouped query heads stacked per key/value head: no copies of
the cached keys per query head), and on a GPU the forwards' widths are rounded up (`pad_widths`) so that a run's
calls repeat their shapes.
In a distributed run every rank scores its own reasoning rows against all prompts: gather the
prompts first with `gather_prompts`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor
from torch.profiler import record_function

from ragen_lit.choices import SCORER_ATTENTION
from ragen_lit.logprobs import cache_keyword, host_tensor_on
from ragen_lit.metrics.masked_scoring import score_pairs, score_with_prompt_cache
from ragen_lit.metrics.packed_scoring import ScoredRows, score_packed
from ragen_lit.models.gqa_attention import folded_gqa
from ragen_lit.parallel.collectives import gather_lists, is_distributed


def cross_score(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    reasonings: Sequence[Sequence[int]],
    *,
    max_tokens_per_forward: int = 8192,
    pad_token_id: int = 0,
    max_tokens_per_chunk: int = 1024,
    temperature: float = 1.0,
    compile_head: bool = False,
    pad_widths: bool | None = None,
    attention: str = "varlen",
) -> tuple[Tensor, Tensor]:
    """Score every reasoning under every prompt (teacher forcing, no grad, model in its current mode).

    Exact deduplication and prefix KV caching (see the module docstring): each distinct prompt is
    encoded once and its KV cache shared by all reasonings; duplicate prompts and reasonings are scored once.

    Args:
        model: HF causal LM (see `token_logprobs`).
        prompts: N token-id lists x_j, each ending where the reasoning starts (after `<think>`).
        reasonings: R non-empty token-id lists z_r (the text inside `<think>…</think>` only).
        max_tokens_per_forward: bound on the padded tokens of one forward. Scoring forwards count
            rows × (longest prompt + longest reasoning of the batch), since every row's attention (and
            its copy of the cached keys/values) spans its prompt's prefix padded to the batch's longest;
            prefix forwards count prompts × longest prefix (that group cache, within the bound but for
            room for the longest row after each prefix, stays alive while its rows are scored); the
            fallback counts pairs × longest pair. A row or
            prompt longer than the bound gets a forward of its own.
        pad_token_id: id written into padding (masked out, never scored).
        max_tokens_per_chunk: most positions whose full-vocabulary logits exist at once.
        temperature: T of log p_T(z_t | ·) = log_softmax(logits / T)[z_t]; the rollout temperature scores the
            reasonings under the distribution they were sampled from (as the update's old log-probs do).
        compile_head: the vocabulary head's log-softmax and gather through `torch.compile` (`token_logprobs`;
            `model.compile`): fused kernels instead of fp32 [chunk, V] tensors; equal up to rounding.
        pad_widths: round the forwards' widths up (prefixes to multiples of 64, rows to multiples of 16;
            masked, same scores), so that a run's calls repeat their shapes and kernels that plan per shape
            (cuDNN attention) reuse their plans. None: on a GPU only.
        attention: `diagnostics.attention`, one of `choices.SCORER_ATTENTION`: "varlen" packs the
            rows (no padding, no gathered prefixes; `max_tokens_per_forward` then bounds a forward's real row
            tokens, and `pad_widths` does not apply), falling back to "efficient" for models whose attention
            cannot run packed (sliding windows, soft-capping, …); the others name the sdpa kernels of the masked
            attention over gathered prefixes (`models.gqa_attention.MASKED_ATTENTION`).

    Returns:
        `(L_tok, L_sum)`, both [R, N] float32 on the model's device.
    """
    return cross_score_scopes(
        model,
        [prompts],
        [reasonings],
        max_tokens_per_forward=max_tokens_per_forward,
        pad_token_id=pad_token_id,
        max_tokens_per_chunk=max_tokens_per_chunk,
        temperature=temperature,
        compile_head=compile_head,
        pad_widths=pad_widths,
        attention=attention,
    )[0]


def cross_score_scopes(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[Sequence[int]]],
    reasonings: Sequence[Sequence[Sequence[int]]] | Callable[[], Sequence[Sequence[Sequence[int]]]],
    *,
    max_tokens_per_forward: int = 8192,
    pad_token_id: int = 0,
    max_tokens_per_chunk: int = 1024,
    temperature: float = 1.0,
    compile_head: bool = False,
    pad_widths: bool | None = None,
    attention: str = "varlen",
) -> list[tuple[Tensor, Tensor]]:
    """`cross_score` of several independent scopes, each reasoning of scope s (`reasonings[s]`) under every prompt of
    scope s (`prompts[s]`), in shared forwards: with `attention="varlen"` the distinct prompts of all scopes are
    encoded in the same prefix forwards and the rows of all scopes packed into the same row forwards, so that a small
    scope (the diagnostics' first-turn scope: 16 prompts of ~330 tokens) adds no forward of its own, whose ~24 layer
    calls would keep the device waiting on the host.

    `reasonings` may be a function returning them, called once the first prefix forward is queued (with "varlen";
    first otherwise): the host work that makes them (the diagnostics tokenise the reasoning texts) then runs while
    the device encodes the prompts. Other arguments as `cross_score`'s; returns its `(L_tok, L_sum)` per scope.
    """
    if len(prompts) == 0:
        raise ValueError("prompts must hold at least one scope's prompts, got none")
    if max_tokens_per_forward < 1:
        raise ValueError(f"max_tokens_per_forward must be >= 1, got {max_tokens_per_forward}")
    where = [f"scope {s}: " if len(prompts) > 1 else "" for s in range(len(prompts))]
    for s, scope in enumerate(prompts):
        if len(scope) == 0:
            raise ValueError(f"{where[s]}prompts must hold at least one prompt, got none")
        for j, prompt in enumerate(scope):
            if len(prompt) == 0:
                raise ValueError(
                    f"{where[s]}prompts[{j}] is empty; every prompt needs at least one token to condition on"
                )
    if attention not in SCORER_ATTENTION:
        raise ValueError(f"attention must be one of {SCORER_ATTENTION}, got {attention!r}")

    device = next(model.parameters()).device
    with record_function("ragen/score.distinct"):
        distinct_prompts, column_of = _distinct([prompt for scope in prompts for prompt in scope])
    columns = list(_spans(column_of, [len(scope) for scope in prompts]))
    resolved: list[ScoredRows] = []

    def rows() -> ScoredRows:
        """The reasonings, checked and deduplicated (made once, on first use)."""
        if not resolved:
            given = reasonings() if callable(reasonings) else reasonings
            if len(given) != len(prompts):
                raise ValueError(f"reasonings must hold one list per scope ({len(prompts)}), got {len(given)}")
            for s, scope in enumerate(given):
                for r, reasoning in enumerate(scope):
                    if len(reasoning) == 0:
                        raise ValueError(
                            f"{where[s]}reasonings[{r}] is empty; filter out samples without reasoning before scoring"
                        )
            with record_function("ragen/score.distinct"):
                distinct, row_of = _distinct([reasoning for scope in given for reasoning in scope])
            spans = list(_spans(row_of, [len(scope) for scope in given]))
            # the distinct reasonings each distinct prompt is scored with: those of every scope that holds it
            wanted: list[set[int]] = [set() for _ in distinct_prompts]
            for scope_columns, scope_rows in zip(columns, spans, strict=True):
                for column in set(scope_columns):
                    wanted[column].update(scope_rows)
            resolved.append(ScoredRows(given, distinct, spans, wanted))
        return resolved[0]

    options = {
        "max_tokens_per_forward": max_tokens_per_forward,
        "pad_token_id": pad_token_id,
        "max_tokens_per_chunk": max_tokens_per_chunk,
        "temperature": temperature,
        "compile_head": compile_head,
        "device": device,
    }
    if pad_widths is None:
        pad_widths = device.type == "cuda"
    usable_cache = cache_keyword(model) is not None
    scores = None
    if attention == "varlen":
        if usable_cache and (callable(reasonings) or any(len(scope) for scope in reasonings)):
            with torch.no_grad(), record_function("ragen/score.packed"):  # the host's work between the regions inside
                scores = score_packed(model, distinct_prompts, rows, **options)
        attention = "efficient"  # the masked kernels, where the rows could not run packed
    given = rows()
    if scores is None and len(prompts) > 1:  # the masked paths score one scope at a time
        shared = {key: value for key, value in options.items() if key != "device"}
        return [
            cross_score_scopes(model, [scope], [scope_rows], **shared, pad_widths=pad_widths, attention=attention)[0]
            for scope, scope_rows in zip(prompts, given.reasonings, strict=True)
        ]
    # grouped-query attention under the rows' masks without copying keys and values per query head
    with torch.no_grad(), folded_gqa(model, attention):
        if scores is None and usable_cache and given.distinct:
            scores = score_with_prompt_cache(model, distinct_prompts, given.distinct, pad_widths=pad_widths, **options)
        if scores is None:
            scores = score_pairs(model, distinct_prompts, given.distinct, **options)
    results = []
    for scope_columns, scope_rows, scope in zip(columns, given.spans, given.reasonings, strict=True):
        seq_logprob = scores[host_tensor_on(scope_rows, device)][:, host_tensor_on(scope_columns, device)]
        reasoning_lengths = host_tensor_on([len(z) for z in scope], device, torch.float64)
        token_logprob = seq_logprob / reasoning_lengths[:, None]
        results.append((token_logprob.float(), seq_logprob.float()))
    return results


def _spans(indices: list[int], sizes: list[int]) -> Iterator[list[int]]:
    """`indices` cut into consecutive pieces of `sizes`."""
    start = 0
    for size in sizes:
        yield indices[start : start + size]
        start += size


def _distinct(sequences: Sequence[Sequence[int]]) -> tuple[list[list[int]], list[int]]:
    """The distinct token lists (first-seen order) and, for every input, the index of its distinct copy."""
    index: dict[tuple[int, ...], int] = {}
    positions = [index.setdefault(_key(sequence), len(index)) for sequence in sequences]
    return [list(sequence) for sequence in index], positions


def _key(sequence: Sequence[int]) -> tuple[int, ...]:
    """A token list as a dictionary key: its Python ints (a tensor's items, which hash by identity, made ints; a
    list's are taken as they are, ~15x faster than converting each: 50k prompt tokens per diagnostics scope)."""
    if isinstance(sequence, Tensor):
        return tuple(sequence.tolist())
    return tuple(sequence) if isinstance(sequence, list | tuple) else tuple(int(token) for token in sequence)


def gather_prompts(prompts: Sequence[Sequence[int]]) -> list[list[int]]:
    """All ranks' prompts, concatenated in rank order (rank 0's first), on every rank.

    Without an initialised process group the prompts are returned unchanged. A row's true column in
    the gathered list is its local index plus the number of prompts held by lower ranks.
    """
    if not is_distributed():
        return prompts
    gathered, _ = gather_lists([[int(token) for token in prompt] for prompt in prompts])
    return gathered
