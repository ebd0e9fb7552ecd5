"""`AgentRLModule.prepare_batch` / `update` on real rollouts: micro-batches are grouped by length, which
must neither reorder the per-row results nor change the gradient."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ragen_lit.config import load_config
from ragen_lit.logprobs import token_logprobs
from ragen_lit.training.batch import collate
from ragen_lit.training.data import RolloutDataModule
from ragen_lit.training.module import AgentRLModule, attach_fabric
from ragen_lit.training.sections import DataSections, ModuleSections

ROOT = Path(__file__).resolve().parents[2]


def _module_and_batch(tiny_model_dir, tmp_path, overrides=()):
    cfg = load_config(
        ROOT / "conf" / "frozenlake.yaml",
        [
            f"model.path={tiny_model_dir}",
            "model.name=hf",
            "rollout.groups=2",
            "rollout.group_size=4",
            "rollout.max_turns=3",
            "rollout.max_new_tokens=32",
            f"logging.output_dir={tmp_path}",
            "trainer.threads=1",
            *overrides,
        ],
    )
    torch.manual_seed(0)
    module = attach_fabric(AgentRLModule(ModuleSections.of(cfg)))  # `update` without a Trainer
    data = RolloutDataModule(DataSections.of(cfg))
    seeds, groups = data.train_seeds(0)
    batch = collate(data.run_rollouts(module, seeds, groups, cfg.rollout.temperature, seed=0), module.pad_token_id)
    lengths = batch["attention_mask"].sum(-1)
    assert not torch.equal(
        torch.argsort(lengths, descending=True, stable=True), torch.arange(len(lengths))
    )  # grouping reorders
    return module, batch


def test_prepare_batch_returns_every_row_in_its_own_place(tiny_model_dir, tmp_path):
    module, batch = _module_and_batch(tiny_model_dir, tmp_path)
    module.cfg.optim.micro_batch_size = 3
    module.prepare_batch(batch, keep_ratio=1.0)
    module.policy.eval()
    with torch.no_grad():
        expected = token_logprobs(
            module.policy,
            batch["input_ids"],
            batch["attention_mask"],
            temperature=module.cfg.rollout.temperature,
            score_mask=batch["loss_mask"],
        ).logprobs
    torch.testing.assert_close(batch["old_logprobs"], expected, atol=1e-5, rtol=0)


def test_the_gradient_does_not_depend_on_the_micro_batch_size(tiny_model_dir, tmp_path):
    module, batch = _module_and_batch(tiny_model_dir, tmp_path)
    module.prepare_batch(batch, keep_ratio=1.0)
    state = {k: v.clone() for k, v in module.state_dict().items()}
    recorded, step = [], module._step

    def spy(optimizer, model, name):
        if name == "actor":
            recorded.append([p.grad.detach().clone() for p in model.parameters() if p.grad is not None])
        step(optimizer, model, name)

    module._step = spy
    for size in (2, 64):
        module.load_state_dict(state)
        module.cfg.optim.micro_batch_size = size
        optimizers, schedulers = module.configure_optimizers()
        module.update(batch, optimizers, schedulers)
    small, whole = recorded
    assert len(small) == len(whole) > 0
    for a, b in zip(small, whole):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("variant", ["padding_free", "pad_to_multiple"])
def test_packed_or_widened_micro_batches_prepare_and_update_as_plain_ones(tiny_model_dir, tmp_path, variant):
    """`optim.padding_free` with a token budget, or `optim.pad_to_multiple` (widths rounded up, beyond the batch's
    own): old and reference log-probs, values, advantages, losses and the actor's and critic's gradients equal
    those of plain padded micro-batches of a fixed size (fp32)."""
    overrides = ["algo=ppo", "algo.kl_coef=0.1", "algo.loss_agg=seq-mean-token-mean"]
    module, batch = _module_and_batch(tiny_model_dir, tmp_path, overrides)
    assert module.critic is not None and module.reference is not None
    state = {k: v.clone() for k, v in module.state_dict().items()}
    grads, step = [], module._step

    def spy(optimizer, model, name):
        grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})
        step(optimizer, model, name)

    module._step = spy
    budget = int(batch["attention_mask"].sum()) // 3  # micro-batches of different row counts
    multiple = batch["input_ids"].shape[1] + 7  # every micro-batch wider than the whole batch
    settings = {"padding_free": (True, budget, 1), "pad_to_multiple": (False, 0, multiple)}[variant]
    runs = []
    for padding_free, micro_batch_tokens, pad_to_multiple in ((False, 0, 1), settings):
        module.load_state_dict(state)
        o = module.cfg.optim
        o.padding_free, o.micro_batch_tokens, o.pad_to_multiple = padding_free, micro_batch_tokens, pad_to_multiple
        prepared = {k: v.clone() for k, v in batch.items()}
        metrics = module.prepare_batch(prepared, keep_ratio=1.0)
        optimizers, schedulers = module.configure_optimizers()
        module.update(prepared, optimizers, schedulers)
        runs.append((prepared, metrics, module.pop_step_stats()))
    (padded, padded_metrics, padded_stats), (packed, packed_metrics, packed_stats) = runs
    for key in ("old_logprobs", "ref_logprobs", "values", "advantages", "returns"):
        torch.testing.assert_close(packed[key], padded[key], atol=1e-5, rtol=0, msg=key)
    assert packed_metrics == pytest.approx(padded_metrics, abs=1e-5)
    assert packed_stats.keys() == padded_stats.keys()
    assert packed_stats["actor/pg_loss"] == pytest.approx(padded_stats["actor/pg_loss"], abs=1e-6)
    assert packed_stats["critic/value_loss"] == pytest.approx(padded_stats["critic/value_loss"], abs=1e-6)
    (padded_actor, padded_critic, packed_actor, packed_critic) = grads
    for got, want in ((packed_actor, padded_actor), (packed_critic, padded_critic)):
        assert got.keys() == want.keys() and len(want) > 0
        for name in want:
            torch.testing.assert_close(got[name], want[name], atol=1e-6, rtol=1e-4, msg=name)


@pytest.mark.parametrize(
    "overrides",
    [
        ["algo=ppo", "algo.kl_coef=0.1"],  # prepare still runs the reference and the critic
        ["algo=grpo", "algo.entropy_coef=0", "algo.kl_coef=0"],  # prepare runs no model at all
    ],
    ids=["ppo-kl", "grpo-bare"],
)
def test_old_logprobs_from_the_update_train_as_a_separate_pass_does(tiny_model_dir, tmp_path, overrides):
    """`optim.old_logprobs_from_update` with one optimizer step per iteration: prepare skips the policy pass, and
    the update's gradients, losses, entropy and log-prob gap equal those with the separate pass (fp32)."""
    module, batch = _module_and_batch(tiny_model_dir, tmp_path, [*overrides, "optim.num_minibatches=1"])
    module.cfg.optim.micro_batch_size = 3  # several micro-batches before the one step
    state = {k: v.clone() for k, v in module.state_dict().items()}
    grads, step = [], module._step
    scored_policy, logprobs = [], module._logprobs

    def spy(optimizer, model, name):
        grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})
        step(optimizer, model, name)

    def counting(model, micro, with_entropy=False):
        if model is module.policy:  # not the KL reference
            scored_policy.append(torch.is_grad_enabled())
        return logprobs(model, micro, with_entropy=with_entropy)

    module._step, module._logprobs = spy, counting
    runs = []
    for from_update in (False, True):
        module.load_state_dict(state)
        module.cfg.optim.old_logprobs_from_update = from_update
        assert module.old_logprobs_in_update is from_update
        scored_policy.clear()
        prepared = {k: v.clone() for k, v in batch.items()}
        metrics = module.prepare_batch(prepared, keep_ratio=1.0)
        assert ("old_logprobs" in prepared) is not from_update
        assert (False in scored_policy) is not from_update  # no gradient-free policy pass in prepare
        optimizers, schedulers = module.configure_optimizers()
        module.update(prepared, optimizers, schedulers)
        runs.append({**metrics, **module.pop_step_stats()})
    separate, own = runs
    assert own.keys() == separate.keys()
    for key in separate:
        assert own[key] == pytest.approx(separate[key], abs=1e-6), key
    assert separate["actor/entropy"] > 0 and "rollout/logprob_gap" in separate  # measured, in both runs
    half = len(grads) // 2
    for got, want in zip(grads[half:], grads[:half]):
        assert got.keys() == want.keys() and len(want) > 0
        for name in want:
            torch.testing.assert_close(got[name], want[name], atol=1e-6, rtol=1e-4, msg=name)


def test_old_logprobs_come_from_prepare_when_the_iteration_takes_several_steps(tiny_model_dir, tmp_path):
    module, batch = _module_and_batch(tiny_model_dir, tmp_path, ["optim.num_minibatches=2"])
    assert module.cfg.optim.old_logprobs_from_update and not module.old_logprobs_in_update
    metrics = module.prepare_batch(batch, keep_ratio=1.0)
    assert "old_logprobs" in batch and "actor/entropy" in metrics and "rollout/logprob_gap" in metrics


def test_the_learning_rate_follows_the_configured_decay_over_the_planned_steps(tiny_model_dir, tmp_path):
    cfg = load_config(
        ROOT / "conf" / "frozenlake.yaml",
        [
            f"model.path={tiny_model_dir}",
            "model.name=hf",
            f"logging.output_dir={tmp_path}",
            "trainer.iterations=2",
            "optim.num_minibatches=2",
            "optim.lr_decay=linear",
            "optim.min_lr_ratio=0.5",
            "optim.actor_lr=0.001",
        ],
    )
    module = AgentRLModule(ModuleSections.of(cfg))
    (actor,), (scheduler,) = module.configure_optimizers()
    lrs = []
    for _ in range(4):  # 2 iterations x 1 epoch x 2 mini-batches: t = 0, 1/4, 2/4, 3/4
        lrs.append(actor.param_groups[0]["lr"])
        actor.step()
        scheduler.step()
    assert lrs == pytest.approx([0.001, 0.000875, 0.00075, 0.000625])


@pytest.mark.parametrize(("dtype", "warned"), [("bfloat16", True), ("float32", False)])
def test_a_learning_rate_that_bfloat16_weights_round_away_is_warned_about(
    tiny_model_dir, tmp_path, caplog, dtype, warned
):
    cfg = load_config(
        ROOT / "conf" / "frozenlake.yaml",
        [
            f"model.path={tiny_model_dir}",
            "model.name=hf",
            f"model.dtype={dtype}",
            f"logging.output_dir={tmp_path}",
            "optim.actor_lr=1e-6",
        ],
    )
    with caplog.at_level("WARNING", logger="ragen_lit.training.optimizers"):
        AgentRLModule(ModuleSections.of(cfg)).configure_optimizers()
    messages = [r.getMessage() for r in caplog.records if "rounds away" in r.getMessage()]
    assert bool(messages) is warned
    if warned:
        assert "policy's weights are bfloat16" in messages[0] and "optim.actor_lr=1e-06" in messages[0]
        assert "model.dtype=float32 trainer.precision=bf16-mixed" in messages[0]


def test_the_adamw_kernels_take_the_same_step_and_auto_fuses_on_a_gpu(tiny_model_dir, tmp_path):
    """`optim.adamw_kernel`: the fused and foreach steps (and PyTorch's default) move the weights alike; auto asks for
    the fused kernel only where the weights are on a GPU."""
    from ragen_lit.training.optimizers import adamw_kernel

    module, batch = _module_and_batch(tiny_model_dir, tmp_path, ["algo=ppo", "optim.actor_lr=1e-3"])
    module.prepare_batch(batch, keep_ratio=1.0)
    state = {k: v.clone() for k, v in module.state_dict().items()}
    stepped = {}
    for kernel in ("auto", "fused", "foreach"):
        module.load_state_dict(state)
        module.cfg.optim.adamw_kernel = kernel
        optimizers, schedulers = module.configure_optimizers()
        assert optimizers[0].defaults["fused"] is (True if kernel == "fused" else None)
        assert optimizers[0].defaults["foreach"] is (True if kernel == "foreach" else None)
        module.update({k: v.clone() for k, v in batch.items()}, optimizers, schedulers)
        stepped[kernel] = {k: v.clone() for k, v in module.state_dict().items() if k.startswith(("policy.", "critic."))}
    moved = [k for k in stepped["auto"] if not torch.equal(stepped["auto"][k], state[k])]
    assert len(moved) > 10  # the step changed the actor's and the critic's weights
    for kernel in ("fused", "foreach"):
        for key in stepped["auto"]:
            torch.testing.assert_close(stepped[kernel][key], stepped["auto"][key], atol=1e-6, rtol=1e-5, msg=key)
    weights = [torch.nn.Parameter(torch.zeros(2))]
    assert adamw_kernel("auto", weights) == {}
    assert adamw_kernel("fused", weights) == {"fused": True}
    assert adamw_kernel("foreach", weights) == {"foreach": True}
    meta = [torch.nn.Parameter(torch.zeros(2, device="meta"))]
    assert adamw_kernel("auto", meta) == {}
    with pytest.raises(ValueError, match="adamw_kernel"):
        load_config(ROOT / "conf" / "frozenlake.yaml", ["optim.adamw_kernel=apex"])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_auto_fuses_adamw_for_plain_weights_on_a_gpu():
    from ragen_lit.training.optimizers import adamw_kernel

    assert adamw_kernel("auto", [torch.nn.Parameter(torch.zeros(2, device="cuda"))]) == {"fused": True}
