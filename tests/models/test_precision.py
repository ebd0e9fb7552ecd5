import pytest
import torch

from ragen_lit.models.precision import stalled_update_fraction


def test_bfloat16_steps_below_half_the_gap_round_away():
    # bfloat16 around 1.0 is spaced 2^-7 = 0.0078125 apart: +0.001 rounds back, +0.005 reaches the next value
    w = torch.ones(4, dtype=torch.bfloat16)
    assert stalled_update_fraction([w], 0.001) == 1.0
    assert stalled_update_fraction([w], 0.005) == 0.0


def test_fraction_counts_elements_across_tensors_and_float32_never_stalls():
    # 0.02 in bfloat16 is spaced 2^-13 ~ 1.2e-4 apart: a 1e-6 step stalls there, but not at 0.0
    # (spacing ~1e-40), and a float32 tensor takes it
    small = torch.tensor([0.02, 0.02, 0.0], dtype=torch.bfloat16)
    full = torch.full((5,), 0.02, dtype=torch.float32)
    assert stalled_update_fraction([small, full], 1e-6) == pytest.approx(2 / 8)
    assert stalled_update_fraction([], 1e-6) == 0.0


def test_paper_learning_rate_on_a_bfloat16_init_stalls_nearly_everything():
    torch.manual_seed(0)
    w = (torch.randn(10_000) * 0.02).to(torch.bfloat16)
    assert stalled_update_fraction([w], 1e-6) > 0.95
    assert stalled_update_fraction([w.float()], 1e-6) == 0.0


def test_the_warning_names_the_model_its_dtype_the_key_and_the_fix_and_stays_quiet_below_half():
    from ragen_lit.models.precision import stalled_update_warning

    model = torch.nn.Linear(100, 100).to(torch.bfloat16)
    torch.nn.init.constant_(model.weight, 0.02)  # 0.02 in bfloat16 is spaced ~1.2e-4 apart
    torch.nn.init.constant_(model.bias, 0.02)
    message = stalled_update_warning(model, 1e-6, "critic", "critic_lr")
    assert message == (
        "the critic's weights are bfloat16: an AdamW step of optim.critic_lr=1e-06 leaves 100% of them unchanged "
        "(it rounds away); train float32 weights with bf16 compute: model.dtype=float32 trainer.precision=bf16-mixed"
    )
    assert stalled_update_warning(model, 1e-3, "critic", "critic_lr") is None  # a step above the spacing moves them
    assert stalled_update_warning(model.float(), 1e-6, "critic", "critic_lr") is None
