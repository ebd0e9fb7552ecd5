"""`shapes.round_up` by hand."""

from ragen_lit.shapes import round_up


def test_round_up_to_a_multiple():
    assert [round_up(n, 64) for n in (1, 63, 64, 65, 128)] == [64, 64, 64, 128, 128]
    assert round_up(7, 1) == 7 and round_up(0, 16) == 0
