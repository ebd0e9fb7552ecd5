"""What a prefill forward embeds: prompts left-padded into one batch, and the plan that computes a prefix several
prompts share once.

A rollout's later turns of one group all start with the group's first prompt; `shared_prefix_plan` finds the runs
of prompts that share a prefix so that the graph cache's fast path prefills each shared prefix once and then every
row's own suffix (`HFEngine(share_prefixes=True)`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


def left_pad(
    prompts: Sequence[Sequence[int]],
    pad_token_id: int,
    device: torch.device,
    vocab_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token-id lists into one batch.

    Returns `input_ids: [B, L] long` (pad_token_id on the left) and `attention_mask: [B, L] bool`
    (True on prompt tokens), where L is the longest prompt.
    With `vocab_size`, raises ValueError for an id outside `[0, vocab_size)` (pad_token_id included).
    """
    width = max(len(p) for p in prompts)
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    attention_mask = torch.arange(width, device=device) >= (width - lengths)[:, None]
    # filled on the host, row by row from the lists, and copied once: 7x faster than one tensor of all the ids put
    # through the mask (which also waited for the device), at 128 rows of ~1.3k ids
    input_ids = np.full((len(prompts), width), pad_token_id, dtype=np.int64)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = prompt
    # checked on the host array, not on the device tensor (reading a device value back would make the host wait for
    # all queued work), nor on the lists: at 128 rows of ~1.7k ids a CPU core took 4 ms over them, 0.1 ms here
    if vocab_size is not None and (input_ids.min() < 0 or input_ids.max() >= vocab_size):
        raise ValueError(f"prompt token ids must be in [0, {vocab_size}), got ids outside that range")
    return torch.from_numpy(input_ids).to(device), attention_mask


@dataclass
class PrefixPlan:
    """How a chunk's prompts share prefixes: `prefixes[k]` is computed once, then row b continues prefix
    `prefix_of[b]` with its own `suffixes[b]` (at least one token)."""

    prefixes: list[list[int]]
    prefix_of: list[int]
    suffixes: list[list[int]]

    def padded_tokens(self) -> int:
        """Positions the two prefill forwards compute: distinct prefixes x the longest, rows x the longest suffix."""
        return len(self.prefixes) * max(map(len, self.prefixes)) + len(self.suffixes) * max(map(len, self.suffixes))


def shared_prefix_plan(prompts: Sequence[list[int]]) -> PrefixPlan:
    """Split the prompts into runs that share a prefix, saving the most prefix tokens.

    In lexicographic order, prompts sharing a prefix are adjacent, and a run of them shares the smallest
    common-prefix length of its neighbours. A run of m prompts sharing p tokens saves (m - 1) * p; the runs
    are chosen by dynamic programming over the sorted order (O(n^2) at most, n = chunk rows; a run grows only while
    its prompts share a token, so about n x the group size for groups that share nothing). Each prompt keeps at
    least its last token as suffix (its logits start the sampling); a run of one has the prompt minus its last
    token as prefix. Example: [1,2,3,4], [1,2,3,5], [9,9] -> prefixes [1,2,3] and [9], suffixes [4], [5], [9].
    """
    order = sorted(range(len(prompts)), key=prompts.__getitem__)
    common = [0] * len(order)  # common[j]: shared prefix length of sorted prompts j - 1 and j
    for j in range(1, len(order)):
        a, b = prompts[order[j - 1]], prompts[order[j]]
        n = min(len(a), len(b))
        common[j] = next((k for k in range(n) if a[k] != b[k]), n)
    # best[j]: the most tokens saved by runs covering sorted prompts 0..j-1; start[j]: where the last run starts
    best, start = [0] * (len(order) + 1), [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        shared = len(prompts[order[j - 1]]) - 1
        best[j], start[j] = best[j - 1], j - 1
        for i in range(j - 2, -1, -1):  # run i..j-1
            shared = min(shared, common[i + 1], len(prompts[order[i]]) - 1)
            if shared == 0:  # and for every longer run, which saves nothing over best[j] >= best[i]
                break
            if best[i] + (j - 1 - i) * shared > best[j]:
                best[j], start[j] = best[i] + (j - 1 - i) * shared, i
    prefixes, prefix_of, suffixes = [], [0] * len(prompts), [[] for _ in prompts]
    j = len(order)
    while j > 0:
        run = order[start[j] : j]
        shared = min([len(prompts[i]) - 1 for i in run] + common[start[j] + 1 : j])
        for i in run:
            prefix_of[i], suffixes[i] = len(prefixes), prompts[i][shared:]
        prefixes.append(prompts[run[0]][:shared])
        j = start[j]
    return PrefixPlan(prefixes, prefix_of, suffixes)
