"""Micro-batching: `merge_micro_batches` undoes `micro_batches` (rows back in place, padded to the batch's width)."""

from __future__ import annotations

import torch

from ragen_lit.training.batch import (
    GPU_PAD_MULTIPLE,
    merge_micro_batches,
    micro_batch_rows,
    micro_batches,
    pad_multiple,
    token_budget_bounds,
)


def test_merge_puts_every_row_back_in_its_place_and_width():
    batch = {
        "input_ids": torch.arange(16).view(4, 4),
        "attention_mask": torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool),
    }
    parts = list(micro_batches(batch, 2))  # lengths 2, 1, 3, 1 -> rows (2, 0) cut to 3, then (1, 3) cut to 1
    merged = merge_micro_batches([p["input_ids"] * 10 for p in parts], batch)
    # the positions a micro-batch cut off come back as 0
    assert merged.tolist() == [[0, 10, 20, 0], [40, 0, 0, 0], [80, 90, 100, 0], [120, 0, 0, 0]]


def test_every_micro_batch_carries_cpu_copies_of_its_masks():
    """The copies `token_logprobs` and the critic read the layout from (`host_masks`), so no forward waits."""
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    loss = mask & torch.tensor([False, True, True, True])
    batch = {"input_ids": torch.arange(16).view(4, 4), "attention_mask": mask, "loss_mask": loss}
    for size, multiple in ((2, 1), (3, 8)):
        parts = list(micro_batches(batch, size, multiple=multiple))
        assert len(parts) == -(-4 // size)
        for part in parts:
            for name in ("attention_mask", "loss_mask"):
                host = part[f"host_{name}"]
                assert host.device.type == "cpu" and torch.equal(host, part[name])
    without_loss = {"input_ids": batch["input_ids"], "attention_mask": mask}
    assert all("host_loss_mask" not in part for part in micro_batches(without_loss, 2))


def test_a_token_budget_fills_each_micro_batch_up_to_what_one_forward_runs():
    lengths = [9, 6, 5, 3, 2, 2]  # longest first
    # padded forwards run rows x the longest: 9 | 6 (6, 5 would be 12) | 5, 3 (10) | 2, 2 (4)
    assert token_budget_bounds(lengths, 11, packed=False) == [(0, 1), (1, 2), (2, 4), (4, 6)]
    # padding-free forwards run the lengths' sum: 9 | 6, 5 (11) | 3, 2, 2 (7)
    assert token_budget_bounds(lengths, 11, packed=True) == [(0, 1), (1, 3), (3, 6)]
    # a row longer than the budget goes alone
    assert token_budget_bounds(lengths, 4, packed=True) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 6)]


def test_token_budget_micro_batches_merge_back_like_fixed_size_ones():
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    batch = {"input_ids": torch.arange(16).view(4, 4), "attention_mask": mask}
    parts = list(micro_batches(batch, size=1, max_tokens=5, packed=True))  # lengths 4, 3, 2, 1 -> (4), (3, 2), (1)
    assert [p["input_ids"].shape for p in parts] == [(1, 4), (2, 3), (1, 1)]
    merged = merge_micro_batches([p["input_ids"] * p["attention_mask"] for p in parts], batch)
    assert torch.equal(merged, batch["input_ids"] * mask)


def test_widths_round_up_to_the_multiple_with_zero_padding_and_merge_back():
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    batch = {"input_ids": torch.arange(1, 21).view(4, 5), "attention_mask": mask, "scores": torch.arange(4.0)}
    parts = list(micro_batches(batch, 2, multiple=4))  # lengths 5, 3 -> width 8 (beyond the batch's 5); 2, 1 -> 4
    assert [p["input_ids"].shape for p in parts] == [(2, 8), (2, 4)]
    assert parts[0]["input_ids"][:, 5:].eq(0).all() and not parts[0]["attention_mask"][:, 5:].any()
    assert parts[0]["scores"].tolist() == [3.0, 2.0]  # 1-D values are left as they are
    merged = merge_micro_batches([p["input_ids"] * p["attention_mask"] for p in parts], batch)
    assert torch.equal(merged, batch["input_ids"] * mask)


def test_a_token_budget_holds_for_the_rounded_widths():
    lengths = [40, 37, 33, 30, 20, 9]
    mask = torch.arange(40)[None, :] < torch.tensor(lengths)[:, None]
    batch = {"input_ids": torch.ones(6, 40, dtype=torch.long), "attention_mask": mask}
    parts = list(micro_batches(batch, 8, max_tokens=130, multiple=16))  # widths 48, 48, 48, 32, 32, 16
    assert [tuple(p["input_ids"].shape) for p in parts] == [(2, 48), (2, 48), (2, 32)]
    assert all(p["input_ids"].numel() <= 130 for p in parts)


def test_auto_pad_multiple_is_64_on_a_gpu_and_off_on_a_cpu_or_when_packing():
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert GPU_PAD_MULTIPLE == 64
    assert pad_multiple(0, False, cuda) == 64
    assert pad_multiple(0, True, cuda) == 1  # padding-free micro-batches have no width to round
    assert pad_multiple(0, False, cpu) == 1
    assert pad_multiple(32, False, cpu) == 32  # an explicit setting wins everywhere
    assert pad_multiple(1, False, cuda) == 1


def test_auto_micro_batches_are_16_rows_on_a_gpu_and_8_on_a_cpu():
    assert micro_batch_rows(0, torch.device("cuda")) == 16
    assert micro_batch_rows(0, torch.device("cpu")) == 8  # what a CPU run always used
    assert micro_batch_rows(3, torch.device("cuda")) == micro_batch_rows(3, torch.device("cpu")) == 3
