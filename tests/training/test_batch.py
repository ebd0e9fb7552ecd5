"""Micro-batching: `merge_micro_batches` undoes `micro_batches` (rows back in place, padded to the batch's width)."""

from __future__ import annotations

import torch

from ragen_lit.training.batch import merge_micro_batches, micro_batches


def test_merge_puts_every_row_back_in_its_place_and_width():
    batch = {
        "input_ids": torch.arange(16).view(4, 4),
        "attention_mask": torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool),
    }
    parts = list(micro_batches(batch, 2))  # lengths 2, 1, 3, 1 -> rows (2, 0) cut to 3, then (1, 3) cut to 1
    merged = merge_micro_batches([p["input_ids"] * 10 for p in parts], batch)
    # the positions a micro-batch cut off come back as 0
    assert merged.tolist() == [[0, 10, 20, 0], [40, 0, 0, 0], [80, 90, 100, 0], [120, 0, 0, 0]]
