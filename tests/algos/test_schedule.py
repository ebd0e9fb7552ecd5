import math

import pytest

from ragen_lit.algos import lr_factor


def factors(decay, *, warmup=0, total=5, min_ratio=0.0):
    return [lr_factor(s, warmup_steps=warmup, total_steps=total, decay=decay, min_ratio=min_ratio) for s in range(6)]


def test_constant_with_warmup():
    assert factors("constant", warmup=2) == [0.5, 1.0, 1.0, 1.0, 1.0, 1.0]


def test_linear_decay_reaches_min_ratio_at_the_last_planned_step_and_stays():
    # t = (s - 1) / 4 after one warm-up step: 1 - 0.8 t
    assert factors("linear", warmup=1, min_ratio=0.2) == pytest.approx([1.0, 1.0, 0.8, 0.6, 0.4, 0.2])


def test_cosine_decay_hand_computed():
    got = factors("cosine", total=4, min_ratio=0.1)
    want = [1.0, 0.1 + 0.9 * (1 + math.cos(math.pi / 4)) / 2, 0.55, 0.1 + 0.9 * (1 + math.cos(3 * math.pi / 4)) / 2]
    assert got[:4] == pytest.approx(want)
    assert got[4:] == pytest.approx([0.1, 0.1])


def test_unknown_decay_is_refused():
    with pytest.raises(ValueError, match="decay must be one of"):
        lr_factor(0, warmup_steps=0, total_steps=1, decay="step", min_ratio=0.0)
