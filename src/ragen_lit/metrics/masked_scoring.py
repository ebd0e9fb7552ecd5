"""The cross-scorer's masked paths: each distinct prompt's prefix encoded once into a KV cache and every reasoning
scored against it, rows of several prompts sharing a forward under a mask (`score_with_prompt_cache`); or, for
models whose cache cannot be gathered that way, every distinct `[x_j | z_r]` pair packed into full forwards
(`score_pairs`). `cross_scoring.cross_score_scopes` calls them, under `models.gqa_attention.folded_gqa`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.profiler import record_function

from ragen_lit.logprobs import host_tensor_on, on_device, token_logprobs
from ragen_lit.shapes import round_up


def score_with_prompt_cache(
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
    reasoning_ids = host_tensor_on(
        [[pad_token_id, *reasonings[r], *[pad_token_id] * (widest - 1 - len(reasonings[r]))] for r in order], device
    )
    reasoning_real = host_tensor_on(lengths, device) + 1
    reasoning_row = host_tensor_on(order, device)
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
            mask = torch.arange(prefix_width, device=device) < host_tensor_on(prefix_lengths, device)[:, None]
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
        prefix_of = host_tensor_on(prefix_lengths, device)
        last_token = host_tensor_on([prompts[j][-1] for j in columns], device)
        column_of = host_tensor_on(columns, device)
        padded_prefixes = [round_up(length, prefix_multiple) for length in prefix_lengths]
        padded_lengths = [round_up(1 + length, row_multiple) - 1 for length in lengths]
        batches = _pack_rows(padded_prefixes, padded_lengths, max_tokens_per_forward)
        # every batch's (member, sample) indices in one host-to-device copy
        pairs = host_tensor_on([pair for rows in batches for pair in rows], device)
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


def score_pairs(
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
        rows = host_tensor_on([r for r, _ in pairs], device)
        cols = host_tensor_on([j for _, j in pairs], device)
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
