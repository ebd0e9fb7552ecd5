"""The cross-scorer's packed path (`diagnostics.attention=varlen`): rows packed end to end over shared prompt prefixes,
nothing gathered or padded.

A group of prompts runs its prefixes as one packed sequence, each over itself, and the attention keeps their keys
and values (`models.prefix_attention.RowSegments.captured`); the group's rows `[x_{P−1} | z_r]` are then packed into
forwards of at most `max_tokens_per_forward` real tokens, each row over its own tokens and its prompt's prefix
(`models.prefix_attention.packed_rows`). `cross_scoring.cross_score_scopes` calls it; it returns None where the
model's attention cannot run packed, and the scorer takes its masked path (`masked_scoring`).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor
from torch.profiler import record_function

from ragen_lit.kernels.varlen_attention import UnsupportedAttention
from ragen_lit.logprobs import HostMasks, host_tensor_on, on_device, token_logprobs
from ragen_lit.models.prefix_attention import RowSegments, packed_rows


class ScoredRows(NamedTuple):
    """`cross_score_scopes`' reasonings: as given (per scope), the distinct ones, each scope's indices into those, and
    per distinct prompt the distinct reasonings it is scored with."""

    reasonings: Sequence[Sequence[Sequence[int]]]
    distinct: list[list[int]]
    spans: list[list[int]]
    wanted: list[set[int]]


def score_packed(
    model: torch.nn.Module,
    prompts: list[list[int]],
    rows: Callable[[], ScoredRows],
    *,
    max_tokens_per_forward: int,
    pad_token_id: int,
    max_tokens_per_chunk: int,
    temperature: float,
    compile_head: bool,
    device: torch.device,
) -> Tensor | None:
    """L_sum [R, N] float64 from packed forwards over shared prefixes (`models.prefix_attention`), or None where the
    model's attention or cache cannot run that way. `rows()` gives the reasonings (`ScoredRows`): it is called once the
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
                reasoning_ids = host_tensor_on(
                    [
                        [pad_token_id, *reasonings[r], *[pad_token_id] * (sizes[0] - sizes[k])]
                        for k, r in enumerate(order)
                    ],
                    device,
                )
                reasoning_row = host_tensor_on(order, device)
                position = {r: k for k, r in enumerate(order)}
            batches = _pack_tokens(sizes, [{position[r] for r in wanted[j]} for j in columns], max_tokens_per_forward)
            if not batches:  # no member of the group is scored with any reasoning
                continue
            _score_group_rows(
                model,
                seq_logprob,
                prefix,
                prefix_lengths=host_tensor_on([len(prompts[j]) - 1 for j in columns], device),
                last_token=host_tensor_on([prompts[j][-1] for j in columns], device),
                column_of=host_tensor_on(columns, device),
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
    cu_prefix = host_tensor_on(_offsets(prefix_lengths), device, torch.int32)
    prefix = RowSegments(cu_rows=cu_prefix, max_row=prefix_lengths[0], captured={})
    if prefix_lengths[0] == 0:
        return prefix
    ids = host_tensor_on(list(itertools.chain.from_iterable(prompt[:-1] for prompt in group)), device)[None]
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
    host_tensor = host_tensor_on(host, device)
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
