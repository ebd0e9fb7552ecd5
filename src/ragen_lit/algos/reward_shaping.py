"""DAPO's overlong reward shaping (Yu et al. 2025, §3.4 "Overlong Reward Shaping"): a length-aware penalty added
to the task reward, so that a response running into the length budget is punished gradually instead of being
cut off with a noisy reward.
"""

from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_length: int, cache_length: int) -> torch.Tensor:
    """DAPO's soft overlong punishment R_length(y) of a response of |y| tokens, L_max = `max_length`,
    L_cache = `cache_length`:

      R_length(y) = 0                                  if |y| ≤ L_max − L_cache
                    ((L_max − L_cache) − |y|) / L_cache  if L_max − L_cache < |y| ≤ L_max
                    −1                                 if |y| > L_max

    It falls linearly from 0 to −1 over the last L_cache tokens of the budget (a response of exactly L_max
    tokens, i.e. one the budget cut off, gets −1); `cache_length=0` is the hard cut: 0 up to L_max, −1 beyond.

    lengths: [N] int or float (tokens per response); 0 ≤ cache_length ≤ max_length -> [N] float32.
    """
    if not 0 <= cache_length <= max_length:
        raise ValueError(f"cache_length must be in [0, max_length={max_length}], got {cache_length}")
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be [N], got shape {tuple(lengths.shape)}")
    lengths = lengths.to(torch.float32)
    soft_start = max_length - cache_length
    penalty = torch.zeros_like(lengths)
    if cache_length > 0:
        in_cache = (lengths > soft_start) & (lengths <= max_length)
        penalty = torch.where(in_cache, (soft_start - lengths) / cache_length, penalty)
    return torch.where(lengths > max_length, -1.0, penalty)
