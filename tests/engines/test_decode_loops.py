"""`engines.decode_loops`' pieces: stop sequences match suffixes only; the finished check answers at once on a CPU
(its GPU behaviour is tested with the engine, `test_hf.py`)."""

from __future__ import annotations

import torch

from ragen_lit.engines.decode_loops import AllStopped, ends_with_stop_sequence


def test_ends_with_stop_sequence_matches_suffixes_only():
    generated = torch.tensor([[1, 2, 3], [2, 3, 1], [9, 9, 3]])
    by_length = [torch.tensor([[3]]), torch.tensor([[2, 3], [7, 7]])]
    assert ends_with_stop_sequence(generated, by_length).tolist() == [True, False, True]
    assert ends_with_stop_sequence(generated, [torch.tensor([[9, 9, 3]])]).tolist() == [False, False, True]
    assert ends_with_stop_sequence(generated[:, :1], [torch.tensor([[1, 2]])]).tolist() == [False, False, False]


def test_the_finished_check_on_a_cpu_answers_at_once():
    check = AllStopped(torch.device("cpu"))
    assert not check(torch.tensor([True, False]))
    assert check(torch.tensor([True, True]))
