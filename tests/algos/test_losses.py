import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen_lit.algos import LOSS_AGG_MODES, actor_loss, aggregate_loss, kl_penalty, policy_loss, value_loss

F64 = torch.float64


def t(values, dtype=F64, requires_grad=False):
    return torch.tensor(values, dtype=dtype, requires_grad=requires_grad)


# ---------------------------------------------------------------- aggregation

LOSS_MAT = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])


@pytest.mark.parametrize(
    "mode, kwargs, expected",
    [
        ("token-mean", {}, 7.0 / 3.0),
        ("seq-mean-token-mean", {}, (1.5 + 4.0) / 2.0),  # the all-masked row is not a sequence
        ("seq-mean-token-sum", {}, (3.0 + 4.0) / 2.0),
        ("seq-mean-token-sum-norm", {}, 7.0 / (2.0 * 3.0)),  # default L = T = 3
        ("seq-mean-token-sum-norm", {"norm_length": 10}, 7.0 / 20.0),
        ("token-mean", {"num_tokens": 14}, 0.5),
        ("seq-mean-token-mean", {"num_seqs": 4}, 5.5 / 4.0),
    ],
)
def test_aggregate_loss_by_hand(mode, kwargs, expected):
    assert aggregate_loss(LOSS_MAT, MASK, mode, **kwargs).item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_aggregate_loss_empty_mask_is_zero_and_differentiable(mode):
    loss_mat = t([[1.0, 2.0]], requires_grad=True)
    loss = aggregate_loss(loss_mat, torch.zeros(1, 2, dtype=torch.bool), mode)
    loss.backward()
    assert loss.item() == 0.0 and loss_mat.grad.abs().sum() == 0


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_aggregate_loss_ignores_nan_padding_in_value_and_gradient(mode):
    loss_mat = t([[1.0, float("nan")], [float("inf"), 2.0]], requires_grad=True)
    mask = torch.tensor([[True, False], [False, True]])
    loss = aggregate_loss(loss_mat, mask, mode)
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(loss_mat.grad).all()


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_aggregate_loss_takes_tensor_totals_as_it_takes_numbers(mode):
    """The update passes its totals as tensors (never read on the host, so no wait for the device): the same loss as
    numbers, and 0 still attached to the graph for an empty mask with zero totals."""
    totals = {"num_tokens": 7, "num_seqs": 3}
    want = aggregate_loss(LOSS_MAT, MASK, mode, **totals)
    got = aggregate_loss(LOSS_MAT, MASK, mode, **{k: torch.tensor(v) for k, v in totals.items()})
    assert got.item() == pytest.approx(want.item())
    loss_mat = LOSS_MAT.clone().requires_grad_()
    empty = torch.zeros_like(MASK)
    zero = aggregate_loss(loss_mat, empty, mode, num_tokens=torch.tensor(0), num_seqs=torch.tensor(0))
    zero.backward()
    assert zero.item() == 0 and not loss_mat.grad.any()
    with pytest.raises(ValueError, match="mask has valid tokens"):
        aggregate_loss(LOSS_MAT, MASK, mode, num_tokens=torch.tensor(0), num_seqs=torch.tensor(0))


def test_aggregate_loss_errors():
    with pytest.raises(ValueError, match="token-mean.*seq-mean-token-sum-norm"):
        aggregate_loss(LOSS_MAT, MASK, "sum")
    with pytest.raises(ValueError, match="num_tokens"):
        aggregate_loss(LOSS_MAT, MASK, "token-mean", num_tokens=0)
    with pytest.raises(ValueError, match="num_seqs"):
        aggregate_loss(LOSS_MAT, MASK, "seq-mean-token-sum", num_seqs=-1)
    with pytest.raises(ValueError, match="norm_length"):
        aggregate_loss(LOSS_MAT, MASK, "seq-mean-token-sum-norm", norm_length=0)
    with pytest.raises(ValueError, match="bool"):
        aggregate_loss(LOSS_MAT, MASK.double(), "token-mean")


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(LOSS_AGG_MODES),
    st.integers(1, 8).flatmap(
        lambda b: st.tuples(
            st.lists(st.lists(st.floats(-10, 10), min_size=5, max_size=5), min_size=b, max_size=b),
            st.lists(st.lists(st.booleans(), min_size=5, max_size=5), min_size=b, max_size=b),
            st.lists(st.integers(1, b), min_size=1, max_size=b),
        )
    ),
)
def test_micro_batch_losses_sum_to_the_mini_batch_loss(mode, batch):
    loss_mat, mask = t(batch[0], requires_grad=True), torch.tensor(batch[1])
    whole = aggregate_loss(loss_mat, mask, mode)
    (whole_grad,) = torch.autograd.grad(whole, loss_mat)
    totals = {"num_tokens": mask.sum(), "num_seqs": mask.any(dim=1).sum(), "norm_length": mask.shape[1]}
    cuts = sorted(set(batch[2]) | {0, mask.shape[0]})
    summed = sum(aggregate_loss(loss_mat[lo:hi], mask[lo:hi], mode, **totals) for lo, hi in zip(cuts[:-1], cuts[1:]))
    (summed_grad,) = torch.autograd.grad(summed, loss_mat)
    assert summed.item() == pytest.approx(whole.item(), abs=1e-9)
    torch.testing.assert_close(summed_grad, whole_grad)


# ---------------------------------------------------------------- policy loss

# (advantage, ratio, dual_clip, loss, d loss / d logprob, clipfrac, dual_clipfrac); clip 0.2 / 0.28
POLICY_CASES = [
    (1.0, 1.1, 3.0, -1.1, -1.1, 0.0, 0.0),  # inside the trust region
    (1.0, 1.25, 3.0, -1.25, -1.25, 0.0, 0.0),  # clip-higher: 1.25 < 1.28 still moves
    (1.0, 1.5, 3.0, -1.28, 0.0, 1.0, 0.0),  # above 1 + clip_high: clipped, no gradient
    (1.0, 0.5, 3.0, -0.5, -0.5, 0.0, 0.0),  # A > 0 is never clipped from below
    (-1.0, 0.79, 3.0, 0.8, 0.0, 1.0, 0.0),  # A < 0 below 1 - clip_low: clipped
    (-1.0, 2.0, 3.0, 2.0, 2.0, 0.0, 0.0),  # A < 0 above the clip: unclipped (pessimistic max)
    (-1.0, 4.0, 3.0, 3.0, 0.0, 0.0, 1.0),  # dual-clip caps the loss at 3·|A|
    (-2.0, 4.0, None, 8.0, 8.0, 0.0, 0.0),  # dual-clip disabled
    (-2.0, 4.0, 0.0, 8.0, 8.0, 0.0, 0.0),  # 0 disables too
]


@pytest.mark.parametrize("advantage, ratio, dual, loss_value, grad, clipfrac, dual_clipfrac", POLICY_CASES)
def test_policy_loss_single_token_by_hand(advantage, ratio, dual, loss_value, grad, clipfrac, dual_clipfrac):
    logprobs = t([[math.log(ratio)]], requires_grad=True)
    mask = torch.ones(1, 1, dtype=torch.bool)
    loss, stats = policy_loss(logprobs, t([[0.0]]), t([[advantage]]), mask, dual_clip=dual)
    loss.backward()
    assert loss.item() == pytest.approx(loss_value)
    assert logprobs.grad.item() == pytest.approx(grad)
    assert stats["clipfrac"].item() == clipfrac and stats["dual_clipfrac"].item() == dual_clipfrac
    assert stats["ratio_mean"].item() == pytest.approx(ratio)
    assert stats["approx_kl"].item() == pytest.approx(ratio - 1.0 - math.log(ratio))
    assert all(value.dim() == 0 and not value.requires_grad for value in stats.values())


def test_policy_loss_masks_and_aggregates():
    # row 0: ρ = 1, A = 2 on two tokens (third padded with garbage) ; row 1: ρ = 1.5 clipped, A = 1
    logprobs = t([[0.0, 0.0, 50.0], [math.log(1.5), 0.0, 0.0]], requires_grad=True)
    old = t([[0.0, 0.0, -50.0], [0.0, 0.0, 0.0]])
    adv = t([[2.0, 2.0, float("nan")], [1.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    loss, stats = policy_loss(logprobs, old, adv, mask, loss_agg="seq-mean-token-mean")
    loss.backward()
    assert loss.item() == pytest.approx((-2.0 + -1.28) / 2.0)
    torch.testing.assert_close(logprobs.grad, t([[-0.5, -0.5, 0.0], [0.0, 0.0, 0.0]]))
    assert stats["clipfrac"].item() == pytest.approx(1.0 / 3.0)


def test_policy_loss_rejects_bad_clips():
    args = (t([[0.0]]), t([[0.0]]), t([[1.0]]), torch.ones(1, 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss(*args, dual_clip=0.5)
    with pytest.raises(ValueError, match="clip_low"):
        policy_loss(*args, clip_low=1.0)
    with pytest.raises(ValueError, match="clip_high"):
        policy_loss(*args, clip_high=-0.1)


# ---------------------------------------------------------------- value loss

# (V, V_old, R, clip, loss, d loss / d V, clipfrac)
VALUE_CASES = [
    (1.0, 0.5, 2.0, 0.2, 0.5 * 1.3**2, 0.0, 1.0),  # clipped value .7 is farther from R: it binds
    (0.6, 0.5, 2.0, 0.2, 0.5 * 1.4**2, -1.4, 0.0),  # inside the clip range
    (1.0, 0.5, 0.0, 0.2, 0.5, 1.0, 0.0),  # clipped value .7 is closer to R: unclipped binds
    (1.0, 0.5, 2.0, None, 0.5, -1.0, 0.0),
    (1.0, 0.5, 2.0, 0.0, 0.5, -1.0, 0.0),
]


@pytest.mark.parametrize("value, old, ret, clip, loss_value, grad, clipfrac", VALUE_CASES)
def test_value_loss_by_hand(value, old, ret, clip, loss_value, grad, clipfrac):
    values = t([[value]], requires_grad=True)
    loss, stats = value_loss(values, t([[old]]), t([[ret]]), torch.ones(1, 1, dtype=torch.bool), clip=clip)
    loss.backward()
    assert loss.item() == pytest.approx(loss_value)
    assert values.grad.item() == pytest.approx(grad)
    assert stats["clipfrac"].item() == clipfrac


def test_value_loss_rejects_negative_clip():
    with pytest.raises(ValueError, match="value_clip"):
        value_loss(t([[0.0]]), t([[0.0]]), t([[0.0]]), torch.ones(1, 1, dtype=torch.bool), clip=-1.0)


# ---------------------------------------------------------------- KL estimators


def test_kl_estimators_by_hand():
    logprobs, ref = t([[-1.0, -2.0, -3.0]]), t([[-2.0, -1.0, -3.0]])  # d = 1, -1, 0
    torch.testing.assert_close(kl_penalty(logprobs, ref, "k1"), t([[1.0, -1.0, 0.0]]))
    torch.testing.assert_close(kl_penalty(logprobs, ref, "k2"), t([[0.5, 0.5, 0.0]]))
    torch.testing.assert_close(kl_penalty(logprobs, ref, "k3"), t([[math.exp(-1.0), math.e - 2.0, 0.0]]))


def test_kl_estimator_errors():
    with pytest.raises(ValueError, match="kl_estimator"):
        kl_penalty(t([[0.0]]), t([[0.0]]), "k4")
    with pytest.raises(ValueError, match="shape"):
        kl_penalty(t([[0.0]]), t([[0.0, 1.0]]), "k1")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(-8, 0), st.floats(-8, 0)), min_size=1, max_size=10))
def test_k2_k3_are_non_negative_and_vanish_at_equality(pairs):
    logprobs, ref = t([[p for p, _ in pairs]]), t([[q for _, q in pairs]])
    assert (kl_penalty(logprobs, ref, "k2") >= 0).all()
    assert (kl_penalty(logprobs, ref, "k3") >= -1e-12).all()
    assert kl_penalty(logprobs, logprobs, "k3").abs().max() == 0


# ---------------------------------------------------------------- actor loss

# two tokens, ratio 1 (logprobs = old), A = (2, 1); entropy (.5, 1.5); log π − log π_ref = (.2, .4), k1 KL
ACTOR = {
    "logprobs": t([[-1.0, -2.0]], requires_grad=True),
    "mask": torch.tensor([[True, True]]),
    "old_logprobs": t([[-1.0, -2.0]]),
    "advantages": t([[2.0, 1.0]]),
    "entropy": t([[0.5, 1.5]], requires_grad=True),
    "ref_logprobs": t([[-1.2, -2.4]]),
}
ACTOR_SETTINGS = {"entropy_coef": 0.1, "kl_coef": 0.5, "kl_estimator": "k1", "loss_agg": "token-mean"}


def _actor(**drop):
    inputs = {k: v for k, v in ACTOR.items() if k not in drop}
    settings = {**ACTOR_SETTINGS, **drop.get("settings", {})}
    return actor_loss(inputs.pop("logprobs"), inputs.pop("mask"), **inputs, **settings)


def test_actor_loss_by_hand():
    # L_pg = mean(−2, −1) = −1.5 ; −.1 · mean(.5, 1.5) = −.1 ; +.5 · mean(.2, .4) = .15
    loss, stats = _actor()
    assert loss.item() == pytest.approx(-1.45)
    assert stats["pg_loss"].item() == pytest.approx(-1.5) and stats["kl"].item() == pytest.approx(0.3)
    assert stats["ratio_mean"].item() == 1.0 and stats["clipfrac"].item() == 0.0
    assert not stats["pg_loss"].requires_grad and not stats["kl"].requires_grad
    loss.backward()
    # d/d log π: −A/2 from L_pg, +.5/2 from k1 KL ; d/dH: −.1/2
    torch.testing.assert_close(ACTOR["logprobs"].grad, t([[-0.75, -0.25]]))
    torch.testing.assert_close(ACTOR["entropy"].grad, t([[-0.05, -0.05]]))
    ACTOR["logprobs"].grad = ACTOR["entropy"].grad = None


def test_actor_loss_composes_the_terms_exactly_as_written_out():
    """Bit for bit what the update wrote out before `actor_loss` existed: L_pg − c_H·agg(H) + c_KL·agg(KL)."""
    m, lp = ACTOR["mask"], ACTOR["logprobs"]
    pg = policy_loss(lp, ACTOR["old_logprobs"], ACTOR["advantages"], m, loss_agg="token-mean")[0]
    written = pg - 0.1 * aggregate_loss(ACTOR["entropy"], m, "token-mean")
    written = written + 0.5 * aggregate_loss(kl_penalty(lp, ACTOR["ref_logprobs"], "k1"), m, "token-mean")
    assert torch.equal(_actor()[0], written)


def test_actor_loss_task_and_regulariser_parts():
    # the task part alone is the policy-gradient loss; the regulariser alone is −.1 + .15 = .05
    task, stats = _actor(entropy=None, settings={"kl_coef": 0.0})
    pg = policy_loss(ACTOR["logprobs"], ACTOR["old_logprobs"], ACTOR["advantages"], ACTOR["mask"])[0]
    assert torch.equal(task, pg)
    assert "kl" not in stats
    regulariser, stats = _actor(advantages=None, old_logprobs=None)
    assert regulariser.item() == pytest.approx(0.05) and set(stats) == {"kl"}
    entropy_only, stats = _actor(advantages=None, settings={"kl_coef": 0.0, "entropy_coef": 0.0})
    assert entropy_only.item() == 0.0 and entropy_only.requires_grad and stats == {}  # still a graph to backpropagate


def test_actor_loss_errors():
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        _actor(ref_logprobs=None)
    with pytest.raises(ValueError, match="no term"):
        _actor(advantages=None, entropy=None, settings={"kl_coef": 0.0})
