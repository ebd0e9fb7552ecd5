import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen_lit.algos import (
    anchored_step_fraction,
    bilevel_gae,
    broadcast_to_tokens,
    estimate_advantages,
    gae,
    gigpo_advantages,
    group_normalized_advantages,
    rloo_advantages,
    scale_by_keep_rate,
    whiten,
)

F64 = torch.float64


def t(values, dtype=F64):
    return torch.tensor(values, dtype=dtype)


# ---------------------------------------------------------------- GAE


def test_gae_gamma_lambda_one_is_return_to_go_minus_value():
    rewards, values = t([[0.0, 0.0, 1.0]]), t([[0.5, 0.2, 0.4]])
    adv, ret = gae(rewards, values, torch.ones(1, 3, dtype=torch.bool))
    torch.testing.assert_close(adv, t([[0.5, 0.8, 0.6]]))
    torch.testing.assert_close(ret, t([[1.0, 1.0, 1.0]]))


def test_gae_discounted_by_hand():
    # t=2: δ=1-.4=.6, A=.6 ; t=1: δ=.9*.4-.2=.16, A=.16+.45*.6=.43 ; t=0: δ=.9*.2-.5=-.32, A=-.32+.45*.43=-.1265
    rewards, values = t([[0.0, 0.0, 1.0]]), t([[0.5, 0.2, 0.4]])
    adv, ret = gae(rewards, values, torch.ones(1, 3, dtype=torch.bool), gamma=0.9, lam=0.5)
    torch.testing.assert_close(adv, t([[-0.1265, 0.43, 0.6]]))
    torch.testing.assert_close(ret, t([[0.3735, 0.63, 1.0]]))


def test_gae_skips_masked_positions():
    # the env token (index 1) and padding (index 3) are skipped: their rewards/values never enter
    rewards, values = t([[0.0, 5.0, 1.0, 9.0]]), t([[0.5, 100.0, 0.4, 100.0]])
    mask = torch.tensor([[True, False, True, False]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    # t=2: A=.6 ; t=0: δ=.9*.4-.5=-.14, A=-.14+.45*.6=.13
    torch.testing.assert_close(adv, t([[0.13, 0.0, 0.6, 0.0]]))
    torch.testing.assert_close(ret, t([[0.63, 0.0, 1.0, 0.0]]))


def test_gae_empty_row_is_zero():
    adv, ret = gae(t([[1.0, 2.0]]), t([[3.0, 4.0]]), torch.zeros(1, 2, dtype=torch.bool))
    assert adv.abs().sum() == 0 and ret.abs().sum() == 0


@pytest.mark.parametrize("dtype", [torch.float32, F64, torch.int64, torch.uint8])
def test_gae_accepts_a_0_1_numeric_mask_as_the_bool_mask(dtype):
    # same case as test_gae_skips_masked_positions: A = [.13, 0, .6, 0], R = [.63, 0, 1, 0]
    rewards, values = t([[0.0, 5.0, 1.0, 9.0]]), t([[0.5, 100.0, 0.4, 100.0]])
    adv, ret = gae(rewards, values, torch.tensor([[1, 0, 1, 0]], dtype=dtype), gamma=0.9, lam=0.5)
    torch.testing.assert_close(adv, t([[0.13, 0.0, 0.6, 0.0]]))
    torch.testing.assert_close(ret, t([[0.63, 0.0, 1.0, 0.0]]))


def test_gae_rejects_a_numeric_mask_with_other_values_and_shape_mismatch():
    with pytest.raises(ValueError, match=r"^mask must be bool or hold only 0 and 1, got torch.float32 holding 0.5$"):
        gae(t([[1.0, 1.0]]), t([[1.0, 1.0]]), torch.tensor([[1.0, 0.5]]))
    with pytest.raises(ValueError, match=r"holding 2$"):
        gae(t([[1.0]]), t([[1.0]]), torch.tensor([[2]]))
    with pytest.raises(ValueError, match="values"):
        gae(t([[1.0, 2.0]]), t([[1.0]]), torch.ones(1, 2, dtype=torch.bool))


token_batches = st.integers(1, 4).flatmap(
    lambda b: st.integers(1, 7).flatmap(
        lambda n: st.tuples(
            st.lists(st.lists(st.floats(-5, 5), min_size=n, max_size=n), min_size=b, max_size=b),
            st.lists(st.lists(st.floats(-5, 5), min_size=n, max_size=n), min_size=b, max_size=b),
            st.lists(st.lists(st.booleans(), min_size=n, max_size=n), min_size=b, max_size=b),
        )
    )
)


@settings(max_examples=60, deadline=None)
@given(token_batches)
def test_gae_unit_gamma_lambda_equals_masked_return_to_go_minus_value(batch):
    rewards, values, mask = t(batch[0]), t(batch[1]), torch.tensor(batch[2])
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    masked_rewards = torch.where(mask, rewards, 0.0)
    return_to_go = masked_rewards.flip(1).cumsum(1).flip(1)
    torch.testing.assert_close(adv, torch.where(mask, return_to_go - values, 0.0))
    torch.testing.assert_close(ret, torch.where(mask, return_to_go, 0.0))


@settings(max_examples=60, deadline=None)
@given(token_batches, st.floats(0, 1), st.floats(0, 1))
def test_gae_equals_plain_gae_on_the_compressed_valid_tokens(batch, gamma, lam):
    rewards, values, mask = t(batch[0]), t(batch[1]), torch.tensor(batch[2])
    adv, _ = gae(rewards, values, mask, gamma=gamma, lam=lam)
    for row in range(rewards.shape[0]):
        idx = mask[row].nonzero().flatten().tolist()
        expected, running, next_value = {}, 0.0, 0.0
        for i in reversed(idx):
            running = rewards[row, i].item() + gamma * next_value - values[row, i].item() + gamma * lam * running
            expected[i], next_value = running, values[row, i].item()
        for i in range(rewards.shape[1]):
            assert adv[row, i].item() == pytest.approx(expected.get(i, 0.0), abs=1e-9)


# ---------------------------------------------------------------- whitening


def test_whiten_by_hand():
    values = t([[1.0, 2.0, 3.0], [4.0, 50.0, 60.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    std = math.sqrt(5.0 / 3.0 + 1e-8)  # unbiased variance of 1..4 = 5/3
    expected = t([[-1.5 / std, -0.5 / std, 0.5 / std], [1.5 / std, 0.0, 0.0]])
    torch.testing.assert_close(whiten(values, mask), expected)
    shifted = torch.where(mask, expected + 2.5, 0.0)
    torch.testing.assert_close(whiten(values, mask, shift_mean=False), shifted)


def test_whiten_degenerate_masks():
    values = t([[3.0, 7.0]])
    assert whiten(values, torch.zeros(1, 2, dtype=torch.bool)).abs().sum() == 0
    one = torch.tensor([[False, True]])
    torch.testing.assert_close(whiten(values, one), t([[0.0, 0.0]]))
    torch.testing.assert_close(whiten(values, one, shift_mean=False), t([[0.0, 7.0]]))


def test_whiten_with_a_reducer_uses_the_sums_of_all_ranks():
    """`reduce` stands for the other ranks' sums: here a second rank holding the same rows (it doubles
    n, Σ A and Σ (A − μ)²). Over the 8 tokens 1, 2, 3, 4, 1, 2, 3, 4: μ = 2.5, unbiased σ² = 10 / 7."""
    values = t([[1.0, 2.0, 3.0], [4.0, 50.0, 60.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    std = math.sqrt(10.0 / 7.0 + 1e-8)
    expected = t([[-1.5 / std, -0.5 / std, 0.5 / std], [1.5 / std, 0.0, 0.0]])
    torch.testing.assert_close(whiten(values, mask, reduce=lambda total: 2 * total), expected)
    # a rank without rows gets the global sums too, and no output
    seen = []
    empty = whiten(torch.zeros(0, 1), torch.zeros(0, 1, dtype=torch.bool), reduce=lambda x: seen.append(x) or x + 4)
    assert empty.shape == (0, 1) and len(seen) == 3


# ---------------------------------------------------------------- bi-level GAE

# two turns: [a a e1 | env | a e2]; reward 1 on the last token
BILEVEL_REWARDS = t([[0.0, 0.0, 0.0, 0.0, 0.0, 1.0]])
BILEVEL_VALUES = t([[0.1, 0.2, 0.3, 9.0, 0.4, 0.5]])
BILEVEL_MASK = torch.tensor([[True, True, True, False, True, True]])
BILEVEL_ENDS = torch.tensor([[False, False, True, False, False, True]])


def test_bilevel_gae_by_hand():
    # turn level (γ_h=.5): A_2 = 1-.5 = .5 ; A_1 = 0+.5*.5-.3 + .5*.5 = .2
    # token level (γ=λ=1): e2 .5, then .1+.5=.6 ; e1 .2, then .1+.2=.3, .1+.3=.4
    adv, ret = bilevel_gae(BILEVEL_REWARDS, BILEVEL_VALUES, BILEVEL_MASK, BILEVEL_ENDS, high_level_gamma=0.5)
    torch.testing.assert_close(adv, t([[0.4, 0.3, 0.2, 0.0, 0.6, 0.5]]))
    torch.testing.assert_close(ret, t([[0.5, 0.5, 0.5, 0.0, 1.0, 1.0]]))


def test_bilevel_gae_with_lambda_by_hand():
    # A_1 = -.05 + .5*.5*.5 = .075 ; tokens: .1+.5*.075=.1375, .1+.5*.1375=.16875 ; .1+.5*.5=.35
    adv, _ = bilevel_gae(BILEVEL_REWARDS, BILEVEL_VALUES, BILEVEL_MASK, BILEVEL_ENDS, lam=0.5, high_level_gamma=0.5)
    torch.testing.assert_close(adv, t([[0.16875, 0.1375, 0.075, 0.0, 0.35, 0.5]]))


def test_bilevel_gae_rejects_turn_end_outside_mask():
    ends = torch.tensor([[False, False, False, True, False, False]])
    with pytest.raises(ValueError, match="turn_end_mask"):
        bilevel_gae(BILEVEL_REWARDS, BILEVEL_VALUES, BILEVEL_MASK, ends)


@settings(max_examples=40, deadline=None)
@given(token_batches, st.floats(0, 1), st.floats(0, 1), st.floats(0, 1))
def test_bilevel_gae_single_turn_equals_gae(batch, gamma, lam, high_level_gamma):
    # with one turn per row (only the implicit end on the last valid token) both estimators agree
    rewards, values, mask = t(batch[0]), t(batch[1]), torch.tensor(batch[2])
    no_ends = torch.zeros_like(mask)
    adv, ret = bilevel_gae(rewards, values, mask, no_ends, gamma=gamma, lam=lam, high_level_gamma=high_level_gamma)
    plain_adv, plain_ret = gae(rewards, values, mask, gamma=gamma, lam=lam)
    torch.testing.assert_close(adv, plain_adv)
    torch.testing.assert_close(ret, plain_ret)


# ---------------------------------------------------------------- group baselines

SCORES = t([1.0, 0.0, 0.0, 1.0, 5.0, 2.0, 4.0, 6.0])
GROUP_IDS = torch.tensor([7, 7, 7, 7, 3, 9, 9, 9])


def test_grpo_by_hand():
    a = 0.5 / (math.sqrt(1.0 / 3.0) + 1e-6)
    b = 2.0 / (2.0 + 1e-6)
    expected = t([a, -a, -a, a, 0.0, -b, 0.0, b])
    torch.testing.assert_close(group_normalized_advantages(SCORES, GROUP_IDS), expected)


def test_drgrpo_is_mean_centring():
    expected = t([0.5, -0.5, -0.5, 0.5, 0.0, -2.0, 0.0, 2.0])
    torch.testing.assert_close(group_normalized_advantages(SCORES, GROUP_IDS, std_normalize=False), expected)


def test_grpo_all_equal_group_is_zero():
    adv = group_normalized_advantages(t([3.0, 3.0, 3.0]), torch.tensor([0, 0, 0]))
    assert adv.abs().sum() == 0


def test_rloo_by_hand():
    expected = t([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0, -3.0, 0.0, 3.0])
    torch.testing.assert_close(rloo_advantages(SCORES, GROUP_IDS), expected)


def test_group_baselines_reject_bad_ids():
    with pytest.raises(ValueError, match="integer"):
        group_normalized_advantages(SCORES, GROUP_IDS.double())
    with pytest.raises(ValueError, match=r"\[B\]"):
        rloo_advantages(SCORES, GROUP_IDS[:3])


def test_broadcast_to_tokens():
    mask = torch.tensor([[True, False], [True, True]])
    torch.testing.assert_close(broadcast_to_tokens(t([2.0, -1.0]), mask), t([[2.0, 0.0], [-1.0, -1.0]]))


def test_scale_by_keep_rate():
    adv = t([[2.0, -4.0]])
    torch.testing.assert_close(scale_by_keep_rate(adv, 0.25, "none"), adv)
    torch.testing.assert_close(scale_by_keep_rate(adv, 0.25, "linear"), t([[0.5, -1.0]]))
    torch.testing.assert_close(scale_by_keep_rate(adv, 0.25, "sqrt"), t([[1.0, -2.0]]))
    with pytest.raises(ValueError, match="advantage_scaling"):
        scale_by_keep_rate(adv, 0.25, "square")
    with pytest.raises(ValueError, match="keep_ratio"):
        scale_by_keep_rate(adv, 1.5, "linear")


# ---------------------------------------------------------------- GiGPO
# Three rollouts, T = 5 positions, γ = 0.5. Rows 0 and 1 are episode group 0, row 2 is group 1 alone.
#   row 0: turn 0 (tokens 1-2) in state 0, reward 0; turn 1 (token 4) in state 1, reward 1 -> R = 1
#   row 1: turn 0 (token 1) in state 0, reward -0.1 (format penalty); turn 1 (token 4) still in state 0,
#          reward 0 -> R = -0.1
#   row 2: turn 0 (token 1) in state 0 (of its own map), reward 1 -> R = 1
_F, _T = False, True
GIGPO_MASK = torch.tensor([[_F, _T, _T, _F, _T], [_F, _T, _F, _F, _T], [_F, _T, _F, _F, _F]])
GIGPO_ENDS = torch.tensor([[_F, _F, _T, _F, _T], [_F, _T, _F, _F, _T], [_F, _T, _F, _F, _F]])
GIGPO_REWARDS = t([[0.0, 0.0, 0.0, 0.0, 1.0], [0.0, -0.1, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0, 0.0]])
GIGPO_STATES = torch.tensor([[-1, -1, 0, -1, 1], [-1, 0, -1, -1, 0], [-1, 0, -1, -1, -1]])
GIGPO_SCORES, GIGPO_GROUPS = t([1.0, -0.1, 1.0]), torch.tensor([0, 0, 1])


def _gigpo(**options):
    return gigpo_advantages(
        GIGPO_SCORES, GIGPO_GROUPS, GIGPO_REWARDS, GIGPO_MASK, GIGPO_ENDS, GIGPO_STATES, gamma=0.5, **options
    )


def _on_turns(row0, row1):
    """[3, 5] token advantages from the per-turn values of rows 0 and 1 (row 2 is alone: 0)."""
    return t([[0.0, row0[0], row0[0], 0.0, row0[1]], [0.0, row1[0], 0.0, 0.0, row1[1]], [0.0] * 5])


def test_gigpo_mean_centred_by_hand():
    # episode: mean of (1, -0.1) = 0.45 -> A^E = +0.55, -0.55
    # discounted returns: row 0: R_0 = 0 + 0.5·1 = 0.5, R_1 = 1; row 1: R_0 = -0.1 + 0.5·0 = -0.1, R_1 = 0
    # step groups of group 0: state 0 = {0.5, -0.1, 0} (mean 0.4/3), state 1 = {1} alone -> 0;
    # row 2's state 0 is another map's (group 1): alone -> 0, and it does not join group 0's state 0
    m = 0.4 / 3
    expected = _on_turns((0.55 + (0.5 - m), 0.55), (-0.55 + (-0.1 - m), -0.55 + (0.0 - m)))
    torch.testing.assert_close(_gigpo(std_normalize=False), expected)


def test_gigpo_std_normalised_and_weighted_by_hand():
    # episode group of two: ±0.55 / (std 1.1/√2 + eps); step group {0.5, -0.1, 0}: sample std
    # sqrt(((0.5 - m)² + (-0.1 - m)² + m²) / 2)
    eps = 1e-6
    episode = 0.55 / (1.1 / math.sqrt(2) + eps)
    m = 0.4 / 3
    std = math.sqrt(((0.5 - m) ** 2 + (-0.1 - m) ** 2 + m**2) / 2) + eps
    step0, step1, step2 = (0.5 - m) / std, (-0.1 - m) / std, (0.0 - m) / std
    expected = _on_turns((episode + 2 * step0, episode), (-episode + 2 * step1, -episode + 2 * step2))
    torch.testing.assert_close(_gigpo(step_weight=2.0), expected)


def test_gigpo_without_anchor_states_or_step_weight_is_grpo():
    grpo = broadcast_to_tokens(group_normalized_advantages(GIGPO_SCORES, GIGPO_GROUPS), GIGPO_MASK)
    torch.testing.assert_close(_gigpo(step_weight=0.0), grpo)
    no_states = torch.full_like(GIGPO_STATES, -1)
    torch.testing.assert_close(
        gigpo_advantages(GIGPO_SCORES, GIGPO_GROUPS, GIGPO_REWARDS, GIGPO_MASK, GIGPO_ENDS, no_states), grpo
    )
    # the step part alone: episode weight 0 leaves A^S on each turn (mean-centred, as in the hand case)
    m = 0.4 / 3
    expected = _on_turns((0.5 - m, 0.0), (-0.1 - m, -m))
    torch.testing.assert_close(_gigpo(episode_weight=0.0, std_normalize=False), expected)


def test_gigpo_state_ids_are_labels_and_group_order_does_not_matter():
    relabelled = torch.where(GIGPO_STATES >= 0, GIGPO_STATES * 7 + 40, -1)
    order = torch.tensor([2, 1, 0])
    shuffled = gigpo_advantages(
        GIGPO_SCORES[order],
        GIGPO_GROUPS[order] + 5,
        GIGPO_REWARDS[order],
        GIGPO_MASK[order],
        GIGPO_ENDS[order],
        relabelled[order],
        gamma=0.5,
    )
    torch.testing.assert_close(shuffled, _gigpo()[order])


def test_gigpo_tokens_after_the_last_marked_end_and_empty_rows():
    # no end marked: the row's last valid token closes its one turn; a row without tokens gets 0
    mask = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])
    ends = torch.zeros(3, 3, dtype=torch.bool)
    adv = gigpo_advantages(t([1.0, 0.0, 5.0]), torch.tensor([0, 0, 0]), t([[0.0] * 3] * 3), mask, ends, ends.long() - 1)
    a = group_normalized_advantages(t([1.0, 0.0, 5.0]), torch.tensor([0, 0, 0]))
    torch.testing.assert_close(adv, t([[a[0], a[0], 0.0], [a[1], 0.0, 0.0], [0.0, 0.0, 0.0]]))
    nothing = torch.zeros(0, 1, dtype=torch.bool)
    no_ids = torch.zeros(0, dtype=torch.long)
    empty = gigpo_advantages(t([]), no_ids, t([]).view(0, 1), nothing, nothing, nothing.long())
    assert empty.shape == (0, 1)


def test_gigpo_rejects_float_state_ids_and_shape_mismatch():
    with pytest.raises(ValueError, match="turn_state_ids must be an integer"):
        _gigpo_states(GIGPO_STATES.double())
    with pytest.raises(ValueError, match="turn_state_ids must have the mask's shape"):
        _gigpo_states(GIGPO_STATES[:, :3])


def test_anchored_step_fraction_counts_turns_that_share_their_state():
    # 5 turns; group 0's state 0 is visited by 3 of them; state 1 and row 2's state 0 (group 1) by one each
    assert anchored_step_fraction(GIGPO_GROUPS, GIGPO_MASK, GIGPO_ENDS, GIGPO_STATES) == pytest.approx(3 / 5)
    assert anchored_step_fraction(GIGPO_GROUPS, GIGPO_MASK, GIGPO_ENDS, torch.full_like(GIGPO_STATES, -1)) == 0.0
    nothing = torch.zeros(0, 1, dtype=torch.bool)
    assert anchored_step_fraction(torch.zeros(0, dtype=torch.long), nothing, nothing, nothing.long()) == 0.0


def _gigpo_states(states):
    return gigpo_advantages(GIGPO_SCORES, GIGPO_GROUPS, GIGPO_REWARDS, GIGPO_MASK, GIGPO_ENDS, states)


# ---------------------------------------------------------------- estimator choice


def test_estimate_advantages_gae_family_by_hand():
    rewards, values, mask = t([[0.0, 0.0, 1.0]]), t([[0.5, 0.2, 0.4]]), torch.ones(1, 3, dtype=torch.bool)
    adv, ret = estimate_advantages("gae", mask, token_rewards=rewards, values=values, gamma=0.9, lam=0.5)
    torch.testing.assert_close(adv, t([[-0.1265, 0.43, 0.6]]))  # as in test_gae_discounted_by_hand
    torch.testing.assert_close(ret, t([[0.3735, 0.63, 1.0]]))
    # whitening changes the advantages only: mean (−.1265 + .43 + .6)/3 = .30117, unbiased variance .144399
    white, white_ret = estimate_advantages(
        "gae", mask, token_rewards=rewards, values=values, gamma=0.9, lam=0.5, whiten_advantages=True
    )
    torch.testing.assert_close(white, (adv - 0.9035 / 3) / math.sqrt(0.288797 / 2 + 1e-8), atol=1e-5, rtol=0)
    torch.testing.assert_close(white_ret, ret)
    adv, ret = estimate_advantages(
        "bilevel_gae",
        BILEVEL_MASK,
        token_rewards=BILEVEL_REWARDS,
        values=BILEVEL_VALUES,
        turn_end_mask=BILEVEL_ENDS,
        high_level_gamma=0.5,
    )
    torch.testing.assert_close(adv, t([[0.4, 0.3, 0.2, 0.0, 0.6, 0.5]]))  # as in test_bilevel_gae_by_hand
    torch.testing.assert_close(ret, t([[0.5, 0.5, 0.5, 0.0, 1.0, 1.0]]))


@pytest.mark.parametrize(
    "estimator, group_zero",  # the advantages of group 0 (scores 1 and 0); group 1's equal scores give 0
    [("grpo", 0.5 / (math.sqrt(0.5) + 1e-6)), ("drgrpo", 0.5), ("rloo", 1.0)],
)
def test_estimate_advantages_group_estimators_broadcast_to_tokens(estimator, group_zero):
    scores, groups = t([1.0, 0.0, 0.5, 0.5]), torch.tensor([0, 0, 1, 1])
    mask = torch.tensor([[True, True, False], [False, True, False], [True, False, False], [True, True, True]])
    # whitening belongs to the GAE family: it must not touch group advantages
    adv, ret = estimate_advantages(estimator, mask, scores=scores, group_ids=groups, whiten_advantages=True)
    a = group_zero
    torch.testing.assert_close(adv, t([[a, a, 0.0], [0.0, -a, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    assert ret is None


def test_estimate_advantages_gigpo_is_gigpo_advantages():
    adv, ret = estimate_advantages(
        "gigpo",
        GIGPO_MASK,
        token_rewards=GIGPO_REWARDS,
        turn_end_mask=GIGPO_ENDS,
        turn_state_ids=GIGPO_STATES,
        scores=GIGPO_SCORES,
        group_ids=GIGPO_GROUPS,
        whiten_advantages=True,  # GAE only
        gigpo_gamma=0.5,
        gigpo_std_normalize=False,
    )
    torch.testing.assert_close(adv, _gigpo(std_normalize=False))
    assert ret is None


def test_estimate_advantages_rejects_unknown_estimator():
    with pytest.raises(ValueError, match="algo.advantage must be one of"):
        estimate_advantages("ppo", torch.ones(1, 2, dtype=torch.bool), scores=t([1.0]), group_ids=torch.tensor([0]))
