"""In-batch cross-scoring: the score matrices that the MI proxies are computed from (ragen2.md §3).

For R reasoning samples z_r and N prompts x_j, with the model teacher-forced on `[x_j | z_r]`:
`L_sum[r, j] = Σ_t log p(z_{r,t} | x_j, z_{r,<t})` and `L_tok[r, j] = L_sum[r, j] / |z_r|`.

Method (exact, no approximation): deduplication plus prefix KV caching. Token-identical prompts (and
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
packed prefix through variable-length attention merged by log-sum-exp (`models.prefix_attention`). Otherwise
attention runs under `models.gqa_attention.folded_gqa` (grouped query heads stacked per key/value head: no copies of
the cached keys per query head), and on a GPU the forwards' widths are rounded up (`pad_widths`) so that a run's
calls repeat their shapes.
In a distributed run every rank scores its own reasoning rows against all prompts: gather the
prompts first with `gather_prompts`.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import torch
from torch import Tensor
from torch.profiler import record_function

from ragen_lit.choices import SCORER_ATTENTION
from ragen_lit.kernels.varlen_attention import UnsupportedAttention
from ragen_lit.logprobs import HostMasks, cache_keyword, on_device, token_logprobs
from ragen_lit.models.gqa_attention import folded_gqa
from ragen_lit.models.prefix_attention import RowSegments, packed_rows
from ragen_lit.parallel.collectives import gather_lists, is_distributed
from ragen_lit.shapes import round_up


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
    resolved: list[_Rows] = []

    def rows() -> _Rows:
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
            resolved.append(_Rows(given, distinct, spans, wanted))
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
                scores = _score_packed(model, distinct_prompts, rows, **options)
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
            scores = _score_with_prompt_cache(model, distinct_prompts, given.distinct, pad_widths=pad_widths, **options)
        if scores is None:
            scores = _score_pairs(model, distinct_prompts, given.distinct, **options)
    results = []
    for scope_columns, scope_rows, scope in zip(columns, given.spans, given.reasonings, strict=True):
        seq_logprob = scores[_sent(scope_rows, device)][:, _sent(scope_columns, device)]
        reasoning_lengths = _sent([len(z) for z in scope], device, torch.float64)
        token_logprob = seq_logprob / reasoning_lengths[:, None]
        results.append((token_logprob.float(), seq_logprob.float()))
    return results


class _Rows(NamedTuple):
    """`cross_score_scopes`' reasonings: as given (per scope), the distinct ones, each scope's indices into those, and
    per distinct prompt the distinct reasonings it is scored with."""

    reasonings: Sequence[Sequence[Sequence[int]]]
    distinct: list[list[int]]
    spans: list[list[int]]
    wanted: list[set[int]]


def _spans(indices: list[int], sizes: list[int]) -> Iterator[list[int]]:
    """`indices` cut into consecutive pieces of `sizes`."""
    start = 0
    for size in sizes:
        yield indices[start : start + size]
        start += size


def _sent(values, device: torch.device, dtype: torch.dtype = torch.long) -> Tensor:
    """`torch.tensor(values, dtype=dtype)` made on the host and sent to `device` without waiting for it
    (`logprobs.on_device`): `torch.tensor(..., device=...)` copies from pageable memory and then waits for everything
    queued on the device, which leaves it idle while the host prepares what comes next."""
    return on_device(torch.tensor(values, dtype=dtype), device)


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


def _score_packed(
    model: torch.nn.Module,
    prompts: list[list[int]],
    rows: Callable[[], _Rows],
    *,
    max_tokens_per_forward: int,
    pad_token_id: int,
    max_tokens_per_chunk: int,
    temperature: float,
    compile_head: bool,
    device: torch.device,
) -> Tensor | None:
    """L_sum [R, N] float64 from packed forwards over shared prefixes (`models.prefix_attention`), or None where the
    model's attention or cache cannot run that way. `rows()` gives the reasonings (`_Rows`): it is called once the
    first group's prefixes are queued. Prompt j is scored with the distinct reasonings `wanted[j]`; the entries of
    other pairs stay 0.

    Prompts are taken longest first in groups whose prefixes (all but each prompt's last token) fit one forward
    (`_packed_groups`: nothing is padded, so lengths need not be similar). A group's prefixes run as one packed
    sequence, each over itself, and the attention keeps their keys and values, packed (`RowSegments.captured`; no
    KV cache). Its rows `[x_{P−1} | z_r]` are then packed into forwards of at most `max_tokens_per_forward` real
    tokens (`_pack_tokens`), positions continuing after each row's prefix, each row over its own tokens and its
    prompt's prefix.
    """
    prompt_order = sorted(range(len(prompts)), key=lambda j: -len(prompts[j]))
    reasonings = None
    try:
        for group in _packed_groups([len(prompts[j]) - 1 for j in prompt_order], max_tokens_per_forward):
            columns = [prompt_order[g] for g in group]
            prefix = _encode_prefixes(model, [prompts[j] for j in columns], max_tokens_per_chunk, device)
            if prefix is None:
                return None
            if reasonings is None:  # the device encodes the first prefixes while the host makes the reasonings
                given = rows()
                reasonings, wanted = given.distinct, given.wanted
                seq_logprob = torch.zeros(len(reasonings), len(prompts), dtype=torch.float64, device=device)
                if not reasonings:
                    return seq_logprob
                order = sorted(range(len(reasonings)), key=lambda r: -len(reasonings[r]))  # longest first, stable
                sizes = [1 + len(reasonings[r]) for r in order]  # a row: the prompt's last token, then the reasoning
                # every reasoning once, behind a slot for the prompt's last token, right-padded (never read there)
                reasoning_ids = _sent(
                    [
                        [pad_token_id, *reasonings[r], *[pad_token_id] * (sizes[0] - sizes[k])]
                        for k, r in enumerate(order)
                    ],
                    device,
                )
                reasoning_row = _sent(order, device)
                position = {r: k for k, r in enumerate(order)}
            batches = _pack_tokens(sizes, [{position[r] for r in wanted[j]} for j in columns], max_tokens_per_forward)
            if not batches:  # no member of the group is scored with any reasoning
                continue
            _score_group_rows(
                model,
                seq_logprob,
                prefix,
                prefix_lengths=_sent([len(prompts[j]) - 1 for j in columns], device),
                last_token=_sent([prompts[j][-1] for j in columns], device),
                column_of=_sent(columns, device),
                batches=batches,
                sizes=sizes,
                reasoning_ids=reasoning_ids,
                reasoning_row=reasoning_row,
                max_tokens_per_chunk=max_tokens_per_chunk,
                temperature=temperature,
                compile_head=compile_head,
            )
    except UnsupportedAttention:
        return None
    return seq_logprob


def _encode_prefixes(
    model: torch.nn.Module, group: list[list[int]], max_tokens_per_chunk: int, device: torch.device
) -> RowSegments | None:
    """A group's prefixes (each prompt but its last token, longest first; all empty or none) run as one packed
    sequence, each over itself: the `RowSegments` its rows then attend over, holding every layer's keys and values,
    or None where a layer did not attend through `packed_rows` (another kind, e.g. linear attention, leaves no keys
    to continue)."""
    prefix_lengths = [len(prompt) - 1 for prompt in group]
    cu_prefix = _sent(_offsets(prefix_lengths), device, torch.int32)
    prefix = RowSegments(cu_rows=cu_prefix, max_row=prefix_lengths[0], captured={})
    if prefix_lengths[0] == 0:
        return prefix
    ids = _sent(list(itertools.chain.from_iterable(prompt[:-1] for prompt in group)), device)[None]
    positions = on_device(torch.cat([torch.arange(length) for length in prefix_lengths]), device)[None]
    real = torch.ones(ids.shape, dtype=torch.bool)  # on the host: the forward need not wait for the device
    with packed_rows(model, prefix), record_function("ragen/score.prefixes"):
        token_logprobs(
            model,
            ids,
            torch.ones_like(ids, dtype=torch.bool),
            position_ids=positions,
            score_mask=torch.zeros_like(ids, dtype=torch.bool),
            max_tokens_per_chunk=max_tokens_per_chunk,
            host_masks=HostMasks(real, ~real),
        )
    layers = getattr(model.config, "num_hidden_layers", len(prefix.captured))
    if sorted(prefix.captured) != list(range(layers)):
        return None
    return dataclasses.replace(
        prefix,
        cu_prefix=cu_prefix,
        max_prefix=prefix_lengths[0],
        prefixes=[prefix.captured[layer] for layer in sorted(prefix.captured)],
        captured=None,
    )


def _score_group_rows(
    model: torch.nn.Module,
    seq_logprob: Tensor,
    prefix: RowSegments,
    *,
    prefix_lengths: Tensor,
    last_token: Tensor,
    column_of: Tensor,
    batches: list[list[tuple[int, int]]],
    sizes: list[int],
    reasoning_ids: Tensor,
    reasoning_row: Tensor,
    max_tokens_per_chunk: int,
    temperature: float,
    compile_head: bool,
) -> None:
    """Score one prompt group's rows, batch by batch (`_score_packed`), into `seq_logprob`: a batch's (group
    member, reasoning index) rows, sorted by member, run as one packed sequence over the members' prefixes."""
    device = seq_logprob.device
    members = len(column_of)
    # every batch's members, reasonings and segment offsets in one host-to-device copy
    host, spans = [], []
    for rows in batches:
        per_member = [0] * members
        for member, k in rows:
            per_member[member] += sizes[k]
        row_sizes = [sizes[k] for _, k in rows]
        start = len(host)
        host += [m for m, _ in rows] + [k for _, k in rows] + _offsets(row_sizes) + _offsets(per_member)
        # which tokens are scored: all but each row's first (its prompt's last token), known here on the host
        scored = torch.ones(1, sum(row_sizes), dtype=torch.bool)
        scored[0, _offsets(row_sizes)[:-1]] = False
        spans.append((start, len(rows), sum(row_sizes), max(row_sizes), max(per_member), scored))
    host_tensor = _sent(host, device)
    for start, count, tokens, longest_row, longest_member, scored in spans:
        parts = [count, count, count + 1, members + 1]
        member, sample, cu_rows, cu_queries = host_tensor[start : start + sum(parts)].split(parts)
        row_of_token = torch.repeat_interleave(torch.arange(count, device=device), cu_rows.diff(), output_size=tokens)
        offset = torch.arange(tokens, device=device) - cu_rows[row_of_token]  # the token's index in its row
        token_member = member[row_of_token]
        ids = torch.where(offset == 0, last_token[token_member], reasoning_ids[sample[row_of_token], offset])
        segments = dataclasses.replace(
            prefix,
            cu_rows=cu_rows.int(),
            max_row=longest_row,
            cu_queries=cu_queries.int(),
            max_queries=longest_member,
            row_starts=cu_rows[row_of_token].int(),
        )
        with packed_rows(model, segments), record_function("ragen/score.rows"):
            logprobs = token_logprobs(
                model,
                ids[None],
                torch.ones_like(ids, dtype=torch.bool)[None],
                position_ids=(prefix_lengths[token_member] + offset)[None],
                score_mask=(offset > 0)[None],  # a row's first token is its prompt's last, not a reasoning token
                max_tokens_per_chunk=max_tokens_per_chunk,
                temperature=temperature,
                compile_head=compile_head,
                host_masks=HostMasks(
                    torch.ones_like(scored), scored
                ),  # the same masks, read without waiting for the device
            ).logprobs[0]
        sums = torch.zeros(count, dtype=torch.float64, device=device).index_add_(0, row_of_token, logprobs.double())
        seq_logprob[reasoning_row[sample], column_of[member]] = sums


def _packed_groups(prefix_lengths: list[int], max_tokens_per_forward: int) -> list[list[int]]:
    """Consecutive groups of indices into `prefix_lengths` (longest first) whose prefixes add up to at most
    `max_tokens_per_forward` tokens (a longer prefix on its own); empty prefixes (one-token prompts) form groups of
    their own, since a row needs keys in every attention it runs."""
    groups: list[list[int]] = []
    total = 0
    for index, length in enumerate(prefix_lengths):
        if groups and total + length <= max_tokens_per_forward and (length > 0) == (prefix_lengths[index - 1] > 0):
            groups[-1].append(index)
            total += length
        else:
            groups.append([index])
            total = length
    return groups


def _offsets(lengths: list[int]) -> list[int]:
    """`[0, l0, l0 + l1, …]`: where consecutive segments of these lengths start (and the total)."""
    return [0, *itertools.accumulate(lengths)]


def _pack_tokens(sizes: list[int], wanted: list[set[int]], max_tokens_per_forward: int) -> list[list[tuple[int, int]]]:
    """Batches of (group member, reasoning index) rows for one prompt group: reasonings longest first (`sizes[k]`
    tokens each), each under every member that wants it (`wanted[member]` holds indices k). As many batches as the
    bound needs (`max_tokens_per_forward`; a row beyond it on its own, and one more batch where the rows do not pack
    that tightly), each taking about an equal share of the tokens left: a last batch of a few rows would be a forward
    whose ~24 layer calls keep the device waiting on the host. Each batch is sorted by member (stably), as the prefix
    segments need."""
    rows = [(member, k) for k in range(len(sizes)) for member, ks in enumerate(wanted) if k in ks]
    remaining = sum(sizes[k] for _, k in rows)
    forwards = -(-remaining // max_tokens_per_forward)
    batches: list[list[tuple[int, int]]] = []
    taken = 0
    while taken < len(rows):
        target = -(-remaining // max(forwards - len(batches), 1))  # an equal share of what is left
        batch, tokens = [], 0
        for member, k in rows[taken:]:
            size = sizes[k]
            # stop at the bound, or where one more row would end farther from the share than this
            if batch and (tokens + size > max_tokens_per_forward or tokens + size - target > target - tokens):
                break
            batch.append((member, k))
            tokens += size
        batches.append(batch)
        taken += len(batch)
        remaining -= tokens
    return [sorted(batch, key=lambda row: row[0]) for batch in batches]


def _score_with_prompt_cache(
    model: torch.nn.Module,
    prompts: list[list[int]],
    reasonings: list[list[int]],
    *,
    max_tokens_per_forward: int,
    pad_token_id: int,
    max_tokens_per_chunk: int,
    temperature: float,
    compile_head: bool,
    device: torch.device,
    pad_widths: bool,
) -> Tensor | None:
    """L_sum [R, N] float64 scored against prompt-prefix KV caches, or None if the model's cache is unsuitable.

    Prompts are taken longest first in groups of similar lengths whose right-padded prefixes (all but
    the last token) fit one forward (`_prefix_groups`); each group's prefixes are encoded in that one
    forward, then its (prompt, reasoning) rows are packed into forwards (`_pack_rows`): a row is
    `[x_{P−1} | z_r]`, right-padded, over its prompt's cached prefix (right-padded to the batch's longest
    prefix and masked there), with positions continuing after the prefix (`_continuation_cache`). With
    `pad_widths`, prefix forwards and cached widths are rounded up to multiples of `_PREFIX_MULTIPLE` and row
    widths to multiples of `_ROW_MULTIPLE` (the extra positions masked).
    """
    from transformers.cache_utils import DynamicCache, DynamicLayer

    seq_logprob = torch.zeros(len(reasonings), len(prompts), dtype=torch.float64, device=device)
    order = sorted(range(len(reasonings)), key=lambda r: -len(reasonings[r]))  # longest first, stable
    lengths = [len(reasonings[r]) for r in order]
    prefix_multiple, row_multiple = (_PREFIX_MULTIPLE, _ROW_MULTIPLE) if pad_widths else (1, 1)
    widest = round_up(1 + lengths[0], row_multiple)
    # every reasoning once, longest first, right-padded behind a slot for the prompt's last token
    reasoning_ids = _sent(
        [[pad_token_id, *reasonings[r], *[pad_token_id] * (widest - 1 - len(reasonings[r]))] for r in order], device
    )
    reasoning_real = _sent(lengths, device) + 1
    reasoning_row = _sent(order, device)
    prompt_order = sorted(range(len(prompts)), key=lambda j: -len(prompts[j]))
    extended_checked = False
    for group in _prefix_groups([len(prompts[j]) - 1 for j in prompt_order], max_tokens_per_forward):
        columns = [prompt_order[g] for g in group]
        prefix_lengths = [len(prompts[j]) - 1 for j in columns]  # longest first
        layers = None
        prefix_width = round_up(prefix_lengths[0], prefix_multiple)
        if prefix_lengths[0] > 0:
            ids = torch.full((len(columns), prefix_width), pad_token_id, dtype=torch.long)
            for row, j in enumerate(columns):
                ids[row, : prefix_lengths[row]] = torch.tensor(prompts[j][:-1], dtype=torch.long)
            ids = on_device(ids, device)
            # no row is empty: a group's prefixes are all at least 3/4 of the longest
            mask = torch.arange(prefix_width, device=device) < _sent(prefix_lengths, device)[:, None]
            group_cache = DynamicCache(config=model.config)
            with record_function("ragen/score.prefixes"):  # the regions name the host's work in profiles
                token_logprobs(
                    model,
                    ids,
                    mask,
                    score_mask=torch.zeros_like(mask),
                    max_tokens_per_chunk=max_tokens_per_chunk,
                    cache=group_cache,
                )
            layers = [(layer.keys, layer.values) for layer in group_cache.layers]
            # only plain full-attention layers holding every prefix position can be gathered and continued
            if not layers or any(
                type(layer) is not DynamicLayer
                or layer.keys is None
                or tuple(layer.keys.shape[::2]) != (len(columns), prefix_width)
                or tuple(layer.values.shape[::2]) != (len(columns), prefix_width)
                for layer in group_cache.layers
            ):
                return None
            # room after each prefix for the widest row, so that a batch's cache is one gather of these
            room = widest
            layers = [(_with_room(keys, room), _with_room(values, room)) for keys, values in layers]
            del group_cache
        prefix_of = _sent(prefix_lengths, device)
        last_token = _sent([prompts[j][-1] for j in columns], device)
        column_of = _sent(columns, device)
        padded_prefixes = [round_up(length, prefix_multiple) for length in prefix_lengths]
        padded_lengths = [round_up(1 + length, row_multiple) - 1 for length in lengths]
        batches = _pack_rows(padded_prefixes, padded_lengths, max_tokens_per_forward)
        # every batch's (member, sample) indices in one host-to-device copy
        pairs = _sent([pair for rows in batches for pair in rows], device)
        start = 0
        for rows in batches:
            member, sample = pairs[start : start + len(rows)].unbind(1)
            start += len(rows)
            width = round_up(1 + max(lengths[k] for _, k in rows), row_multiple)
            cached = min(round_up(max(prefix_lengths[g] for g, _ in rows), prefix_multiple), prefix_width)
            input_ids = reasoning_ids[sample, :width]
            input_ids[:, 0] = last_token[member]  # its hidden state predicts the reasoning's first token
            attention_mask = torch.arange(width, device=device) < reasoning_real[sample, None]
            batch_cache = cache_mask = None
            if cached > 0:
                with record_function("ragen/score.gather"):
                    batch_cache = _continuation_cache(model.config, layers, member, cached, width)
                cache_mask = torch.arange(cached, device=device) < prefix_of[member, None]
            with record_function("ragen/score.rows"):
                logprobs = token_logprobs(
                    model,
                    input_ids,
                    attention_mask,
                    max_tokens_per_chunk=max_tokens_per_chunk,
                    temperature=temperature,
                    cache=batch_cache,
                    cache_mask=cache_mask,
                    compile_head=compile_head,
                ).logprobs
            if batch_cache is not None and not extended_checked:  # once per call: the check waits for the device
                if batch_cache.get_seq_length() != cached + width:
                    raise RuntimeError("the model did not extend the prompt's KV cache; cannot score against it")
                extended_checked = True
            seq_logprob[reasoning_row[sample], column_of[member]] = logprobs.double().sum(-1)
    return seq_logprob


# `pad_widths`: prefix (cached) widths and row widths are rounded up to multiples of these
_PREFIX_MULTIPLE = 64
_ROW_MULTIPLE = 16


def _with_room(cached: Tensor, room: int) -> Tensor:
    """`cached` [G, H, P, D] followed by `room` zero positions along the sequence: [G, H, P + room, D]."""
    grown = cached.new_zeros(*cached.shape[:2], cached.shape[2] + room, cached.shape[3])
    grown[:, :, : cached.shape[2]] = cached
    return grown


def _continuation_cache(config, layers: list[tuple[Tensor, Tensor]], member: Tensor, cached: int, width: int):
    """A static KV cache of `cached + width` positions for a batch of rows: row i's first `cached` positions
    hold prompt `member[i]`'s prefix keys and values (gathered from `layers`, per layer `(keys, values)` of
    [G, H, >= cached + width, D] with zeros after each prefix), and the forward writes the rows' own `width`
    tokens in place after them. One copy of each row's prefix per layer: a dynamic cache would copy it again
    when the forward appends to it."""
    from transformers import StaticCache

    keys, _ = layers[0]
    cache = StaticCache(config=config, max_cache_len=cached + width)
    cache.early_initialization(len(member), keys.shape[1], keys.shape[3], keys.dtype, keys.device)
    for static_layer, (keys, values) in zip(cache.layers, layers, strict=True):
        torch.index_select(keys[:, :, : cached + width], 0, member, out=static_layer.keys)
        torch.index_select(values[:, :, : cached + width], 0, member, out=static_layer.values)
        static_layer.cumulative_length.fill_(cached)
    return cache


def _prefix_groups(prefix_lengths: list[int], max_tokens_per_forward: int) -> list[list[int]]:
    """Consecutive groups of indices into `prefix_lengths` (longest first) whose right-padded prefixes fit
    one forward (members × the first, longest prefix <= max_tokens_per_forward, or a single prompt) and
    are at least 3/4 of the longest, so that neither the prefix forward nor the group's rows pad much."""
    groups: list[list[int]] = []
    for index, length in enumerate(prefix_lengths):
        longest = prefix_lengths[groups[-1][0]] if groups else 0
        if groups and (len(groups[-1]) + 1) * longest <= max_tokens_per_forward and 4 * length >= 3 * longest:
            groups[-1].append(index)
        else:
            groups.append([index])
    return groups


def _pack_rows(
    prefix_lengths: list[int], lengths: list[int], max_tokens_per_forward: int
) -> list[list[tuple[int, int]]]:
    """Batches of (group member, reasoning index) rows for one prompt group: reasonings longest first,
    each under every member, so that a batch's rows have similar lengths; a batch holds rows while
    rows × (its longest prefix + 1 + its longest reasoning) <= max_tokens_per_forward (a row beyond the
    bound on its own)."""
    batches: list[list[tuple[int, int]]] = []
    batch: list[tuple[int, int]] = []
    cached = width = 0
    for k, length in enumerate(lengths):
        for member, prefix in enumerate(prefix_lengths):
            new_cached, new_width = max(cached, prefix), max(width, 1 + length)
            if batch and (len(batch) + 1) * (new_cached + new_width) > max_tokens_per_forward:
                batches.append(batch)
                batch, new_cached, new_width = [], prefix, 1 + length
            batch.append((member, k))
            cached, width = new_cached, new_width
    if batch:
        batches.append(batch)
    return batches


def _score_pairs(
    model: torch.nn.Module,
    prompts: list[list[int]],
    reasonings: list[list[int]],
    *,
    max_tokens_per_forward: int,
    pad_token_id: int,
    max_tokens_per_chunk: int,
    temperature: float,
    compile_head: bool,
    device: torch.device,
) -> Tensor:
    """L_sum [R, N] float64 from full `[x_j | z_r]` forwards, pairs packed longest first."""
    num_reasonings, num_prompts = len(reasonings), len(prompts)
    pair_lengths = [
        (len(prompts[j]) + len(reasonings[r]), r, j) for r in range(num_reasonings) for j in range(num_prompts)
    ]
    pair_lengths.sort(key=lambda item: -item[0])  # stable: ties keep (r, j) order
    seq_logprob = torch.zeros(num_reasonings, num_prompts, dtype=torch.float64, device=device)
    start = 0
    while start < len(pair_lengths):
        longest = pair_lengths[start][0]
        stop = min(len(pair_lengths), start + max(1, max_tokens_per_forward // longest))
        pairs = [(r, j) for _, r, j in pair_lengths[start:stop]]
        input_ids, attention_mask, reasoning_mask = _pair_batch(
            prompts, reasonings, pairs, longest, pad_token_id, device
        )
        logprobs = token_logprobs(
            model,
            input_ids,
            attention_mask,
            score_mask=reasoning_mask,
            max_tokens_per_chunk=max_tokens_per_chunk,
            temperature=temperature,
            compile_head=compile_head,
        ).logprobs
        rows = _sent([r for r, _ in pairs], device)
        cols = _sent([j for _, j in pairs], device)
        seq_logprob[rows, cols] = logprobs.double().sum(-1)
        start = stop
    return seq_logprob


def _pair_batch(
    prompts: Sequence[Sequence[int]],
    reasonings: Sequence[Sequence[int]],
    pairs: list[tuple[int, int]],
    length: int,
    pad_token_id: int,
    device: torch.device,
) -> tuple[Tensor, Tensor, Tensor]:
    """Right-padded `[x_j | z_r]` rows: input ids [P, length] long, attention and reasoning masks [P, length] bool."""
    input_ids = torch.full((len(pairs), length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(len(pairs), length, dtype=torch.bool)
    reasoning_mask = torch.zeros(len(pairs), length, dtype=torch.bool)
    for row, (r, j) in enumerate(pairs):
        prompt_length, total = len(prompts[j]), len(prompts[j]) + len(reasonings[r])
        input_ids[row, :total] = torch.tensor([*prompts[j], *reasonings[r]], dtype=torch.long)
        attention_mask[row, :total] = True
        reasoning_mask[row, prompt_length:total] = True
    return on_device(input_ids, device), on_device(attention_mask, device), on_device(reasoning_mask, device)


def gather_prompts(prompts: Sequence[Sequence[int]]) -> list[list[int]]:
    """All ranks' prompts, concatenated in rank order (rank 0's first), on every rank.

    Without an initialised process group the prompts are returned unchanged. A row's true column in
    the gathered list is its local index plus the number of prompts held by lower ranks.
    """
    if not is_distributed():
        return prompts
    gathered, _ = gather_lists([[int(token) for token in prompt] for prompt in prompts])
    return gathered
