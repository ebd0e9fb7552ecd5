"""The engine's two decode loops, token by token after a prefill, and what they share (stop detection, outputs).

- `decode_dynamic` (cache="dynamic" or "static"): transformers' KV cache; rows that have stopped are dropped from
  the batch and the cache once a tenth of the rows have stopped.
- `decode_fixed` (cache="graph"): every row stays in its `DecodeSlot` until all have stopped (a row's tokens after
  its stop are discarded), so each step has the same shapes and replays one captured CUDA graph; no step makes the
  host wait for the device (`AllStopped`).

Both sample every row at once (`sampling.sample_next_tokens`) and detect stop tokens and stop sequences with tensor
operations.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.profiler import record_function

from ragen_lit.engines.base import Generation, SamplingParams
from ragen_lit.engines.sampling import sample_next_tokens

# Dropping finished rows costs one copy of the cache. Measured on 2 busy CPU cores (1 thread; tiny-model
# shape, 128 rows in groups of 16, ~250-token prompts, up to 100 new tokens, rows ending at random),
# median tokens/s dynamic/static cache: never drop 272/332, drop at 50% 308/503, at 25% 446/616,
# at 10% 547/690, at 3% 562/601.
_DROP_FINISHED_FRACTION = 0.1

# cache="graph": how often (decode steps) the loop asks the device whether every row has stopped.
FINISHED_CHECK_EVERY = 8


def decode_dynamic(
    model: torch.nn.Module,
    cache,
    cache_keyword: str,
    logits: torch.Tensor,
    prompt_mask: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> list[Generation]:
    """Sample up to `params.max_new_tokens` per row after a prefill: `logits [B, V]` of each row's last prompt token,
    `cache` (a transformers `Cache` holding the B rows' prompts, passed to `model` as `cache_keyword`), `prompt_mask
    [B, W] bool` the positions each row attends."""
    device = logits.device
    batch_size, prompt_width = prompt_mask.shape
    max_new_tokens = params.max_new_tokens
    stops = Stops(params, device)

    # Outputs, indexed by chunk row; `rows` maps each batch row to its chunk row.
    token_ids, logprobs, num_generated, stopped = output_buffers(batch_size, max_new_tokens, device)

    rows = torch.arange(batch_size, device=device)
    finished = torch.zeros(batch_size, dtype=torch.bool, device=device)
    attention_mask = torch.cat(
        [prompt_mask, torch.ones(batch_size, max_new_tokens, dtype=torch.bool, device=device)], dim=1
    )
    next_position = prompt_mask.sum(-1)
    for step in range(max_new_tokens):
        next_ids, next_logprobs = sample_next_tokens(logits, params.temperature, params.top_k, params.top_p, generator)
        live_rows = rows[~finished]
        token_ids[live_rows, step] = next_ids[~finished]
        logprobs[live_rows, step] = next_logprobs[~finished]
        newly_stopped = stops.hit(next_ids, token_ids, step, rows) & ~finished
        num_generated[rows[newly_stopped]] = step + 1
        stopped[rows[newly_stopped]] = True
        finished |= newly_stopped
        if step == max_new_tokens - 1 or bool(finished.all()):
            break
        if int(finished.sum()) >= _DROP_FINISHED_FRACTION * finished.numel():
            keep = ~finished
            cache.reorder_cache(keep.nonzero()[:, 0])
            rows, next_ids, next_position = rows[keep], next_ids[keep], next_position[keep]
            attention_mask, finished = attention_mask[keep], finished[keep]
        out = model(
            input_ids=next_ids[:, None],
            attention_mask=attention_mask[:, : prompt_width + step + 1],
            position_ids=next_position[:, None],
            use_cache=True,
            **{cache_keyword: cache},
        )
        logits = out.logits[:, -1]
        next_position = next_position + 1
    return generations(token_ids, logprobs, num_generated, stopped)


def decode_fixed(
    slot,
    logits: torch.Tensor,
    prompt_mask: torch.Tensor,
    params: SamplingParams,
    stops: Stops,
    generator: torch.Generator | None,
) -> tuple[list[Generation], int]:
    """`decode_dynamic` on a loaded `decode_graphs.DecodeSlot`: every step feeds every row (`slot.step`). `stops` is
    made before the prefill is queued (its host-memory copies would wait for it). Returns the generations and the
    decode steps run: the first that many sampled tokens of every row have keys and values in the slot."""
    device = logits.device
    batch_size, prompt_width = prompt_mask.shape
    max_new_tokens = params.max_new_tokens
    positions = prompt_mask.sum(-1)
    token_ids, logprobs, num_generated, finished = output_buffers(batch_size, max_new_tokens, device)
    all_stopped = AllStopped(device)
    fed = 0
    with record_function("ragen/engine.decode"):
        for step in range(max_new_tokens):
            next_ids, next_logprobs = sample_next_tokens(
                logits, params.temperature, params.top_k, params.top_p, generator
            )
            token_ids[:, step] = next_ids
            logprobs[:, step] = next_logprobs
            newly_stopped = stops.hit(next_ids, token_ids, step) & ~finished
            num_generated = torch.where(newly_stopped, step + 1, num_generated)
            finished |= newly_stopped
            if step == max_new_tokens - 1:
                break
            if (step + 1) % FINISHED_CHECK_EVERY == 0 and all_stopped(finished):
                break
            logits = slot.step(next_ids, positions + step, prompt_width + step)[:batch_size]
            fed += 1
    with record_function("ragen/engine.outputs"):
        return generations(token_ids, logprobs, num_generated, finished), fed


def ends_with_stop_sequence(generated: torch.Tensor, stop_sequences: Sequence[torch.Tensor]) -> torch.Tensor:
    """Which rows' generated ids currently end with one of the stop sequences.

    `generated: [B, t] long` (the ids generated so far); each `stop_sequences[j]: [S_j, m_j] long`
    holds all stop sequences of length m_j. Returns `hits: [B] bool`.
    """
    hits = torch.zeros(generated.shape[0], dtype=torch.bool, device=generated.device)
    for sequences in stop_sequences:
        length = sequences.shape[1]
        if length <= generated.shape[1]:
            tail = generated[:, -length:]
            hits |= (tail[:, None, :] == sequences[None]).all(dim=-1).any(dim=-1)
    return hits


class AllStopped:
    """Whether every row of a decode loop has stopped, asked without making the host wait for the device.

    On a GPU a check queues a copy of `finished.all()` into pinned host memory behind the steps launched so far and
    answers with the previous check's copy, which the device made a check period ago: the host never drains the
    queue, so the device never idles while the host launches the next steps (a synchronous check left it idle
    tens of ms per multi-turn rollout on an H200: docs/PERFORMANCE.md). `finished` only grows, so a late
    "all stopped" is still true; the loop runs at most one check period longer, and the steps after a row's stop are
    discarded anyway. Elsewhere the current value, read at once."""

    def __init__(self, device: torch.device):
        self.flag = torch.zeros((), dtype=torch.bool, pin_memory=True) if device.type == "cuda" else None
        self.copied: torch.cuda.Event | None = None

    def __call__(self, finished: torch.Tensor) -> bool:
        if self.flag is None:
            return bool(finished.all())
        answer = False
        if self.copied is not None:
            self.copied.synchronize()
            answer = bool(self.flag)
        self.flag.copy_(finished.all(), non_blocking=True)
        self.copied = torch.cuda.Event()
        self.copied.record()
        return answer


class Stops:
    """`params`' stop token ids and stop sequences as device tensors (sequences grouped by length)."""

    def __init__(self, params: SamplingParams, device: torch.device):
        self.token_ids = torch.tensor(list(params.stop_token_ids), dtype=torch.long, device=device)
        self.sequences = [
            torch.tensor([list(s) for s in params.stop_sequences if len(s) == length], dtype=torch.long, device=device)
            for length in sorted({len(s) for s in params.stop_sequences})
        ]
        self.longest = max((len(s) for s in params.stop_sequences), default=0)

    def hit(
        self, next_ids: torch.Tensor, generated: torch.Tensor, step: int, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Which rows stop at `step`: `next_ids: [B]` is a stop token, or the ids so far (`generated`,
        `next_ids` included at column `step`; its rows `rows` if given, else all) now end with a stop
        sequence. Returns `[B] bool`."""
        hit = torch.isin(next_ids, self.token_ids)
        if self.sequences:
            columns = slice(max(0, step + 1 - self.longest), step + 1)
            recent = generated[:, columns] if rows is None else generated[rows, columns]
            hit |= ends_with_stop_sequence(recent, self.sequences)
        return hit


def output_buffers(batch_size: int, max_new_tokens: int, device: torch.device):
    """Per chunk row: sampled ids `[B, N]`, their log-probs `[B, N]`, the count kept (N unless the row
    stops) and whether it stopped."""
    return (
        torch.zeros(batch_size, max_new_tokens, dtype=torch.long, device=device),
        torch.zeros(batch_size, max_new_tokens, dtype=torch.float32, device=device),
        torch.full((batch_size,), max_new_tokens, dtype=torch.long, device=device),
        torch.zeros(batch_size, dtype=torch.bool, device=device),
    )


def generations(
    token_ids: torch.Tensor, logprobs: torch.Tensor, num_generated: torch.Tensor, stopped: torch.Tensor
) -> list[Generation]:
    """One `Generation` per row: the first `num_generated[b]` ids and log-probs of row b."""
    lengths = num_generated.tolist()
    reasons = ["stop" if s else "length" for s in stopped.tolist()]
    return [
        Generation(token_ids=ids[:n], logprobs=lps[:n], finish_reason=reason)
        for ids, lps, n, reason in zip(token_ids.tolist(), logprobs.tolist(), lengths, reasons)
    ]
