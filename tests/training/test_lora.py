"""`model.lora.r > 0` in the training module: only the adapters (and the value head) are in the optimizers, an update
leaves every base weight as it was, the KL reference is the base model with no copy of it, the transformers engine
samples from the updated adapters, checkpoints hold no frozen weight, `trainer.resume=last` continues exactly, and
`export` writes the merged model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.parallel.test_fsdp import _raw_batch

from ragen_lit.config import load_config
from ragen_lit.engines.base import SamplingParams
from ragen_lit.engines.hf import HFEngine
from ragen_lit.logprobs import token_logprobs
from ragen_lit.models import load_policy
from ragen_lit.training.module import AgentRLModule, attach_fabric
from ragen_lit.training.sections import ModuleSections

pytestmark = pytest.mark.floors
ROOT = Path(__file__).resolve().parents[2]
# lr 1e-2: one step moves the tiny model's log-probs far beyond float32 noise
LORA = ["model.dtype=float32", "model.lora.r=4", "optim.actor_lr=1e-2", "optim.critic_lr=1e-2", "trainer.threads=1"]


def _module(*extra: str) -> AgentRLModule:
    torch.manual_seed(0)
    cfg = load_config(None, [*LORA, "optim.micro_batch_size=3", *extra])
    module = attach_fabric(AgentRLModule(ModuleSections.of(cfg)))
    module.on_fit_start()
    return module


def _one_update(module: AgentRLModule) -> dict[str, torch.Tensor]:
    """prepare_batch + one AdamW step on the fixed batch of `test_fsdp`; returns the prepared batch."""
    batch = _raw_batch(module.pad_token_id, module.policy.config.vocab_size)
    module.prepare_batch(batch, keep_ratio=1.0)
    optimizers, schedulers = module.configure_optimizers()
    module.update(batch, optimizers, schedulers)
    return batch


def _lora_names(model: torch.nn.Module) -> set[str]:
    return {n for n, _ in model.named_parameters() if ".lora_A." in n or ".lora_B." in n}


def test_only_the_adapters_and_the_value_head_are_in_the_optimizers():
    module = _module("algo=ppo")
    (actor, critic), _ = module.configure_optimizers()
    names = {id(p): n for model in (module.policy, module.critic) for n, p in model.named_parameters()}
    actor_names = {names[id(p)] for group in actor.param_groups for p in group["params"]}
    critic_names = {names[id(p)] for group in critic.param_groups for p in group["params"]}
    assert actor_names == _lora_names(module.policy) and len(actor_names) == 2 * 7 * 2
    assert critic_names == _lora_names(module.critic) | {"value_head.weight", "value_head.bias"}


def test_an_update_changes_adapters_and_no_base_weight():
    module = _module("algo=ppo")
    before = {
        m: {n: p.detach().clone() for n, p in getattr(module, m).named_parameters()} for m in ("policy", "critic")
    }
    _one_update(module)
    for m in ("policy", "critic"):
        model, lora = getattr(module, m), _lora_names(getattr(module, m))
        changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[m][n])}
        assert changed and changed <= lora | {"value_head.weight", "value_head.bias"}, m


def test_the_kl_reference_is_the_base_model_and_no_copy_of_it():
    module = _module("algo=grpo", "algo.kl_coef=0.1")
    assert module.reference is None  # no frozen deep copy
    _one_update(module)  # the adapters now change the policy
    batch = _raw_batch(module.pad_token_id, module.policy.config.vocab_size)
    module.prepare_batch(batch, keep_ratio=1.0)
    base = load_policy(module.model_path, "float32").eval()
    with torch.no_grad():
        expected = token_logprobs(base, batch["input_ids"], batch["attention_mask"], score_mask=batch["loss_mask"])
    mask = batch["loss_mask"]
    torch.testing.assert_close(batch["ref_logprobs"][mask], expected.logprobs[mask], rtol=0, atol=1e-5)
    assert (batch["old_logprobs"][mask] - batch["ref_logprobs"][mask]).abs().mean() > 0.1  # the check can fail
    with torch.no_grad():  # after the reference pass the adapters act again
        after = token_logprobs(module.policy, batch["input_ids"], batch["attention_mask"], score_mask=mask).logprobs
    torch.testing.assert_close(after[mask], batch["old_logprobs"][mask], rtol=1e-5, atol=1e-5)


def test_the_hf_engine_samples_from_the_updated_adapters():
    module = _module("algo=grpo")
    engine = HFEngine(module.policy, pad_token_id=module.pad_token_id)
    prompt = [5, 17, 90, 33, 12, 48, 7]
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=3)
    _one_update(module)
    engine.sync(module.policy)
    (generation,) = engine.generate([prompt], params)
    ids = torch.tensor([prompt + generation.token_ids])
    scored = torch.zeros_like(ids, dtype=torch.bool)
    scored[0, len(prompt) :] = True
    with torch.no_grad():
        trainer = token_logprobs(module.policy, ids, torch.ones_like(scored), score_mask=scored).logprobs[scored]
        with module.policy.disable_adapter():  # the base model's log-probs: the comparison below can fail
            base = token_logprobs(module.policy, ids, torch.ones_like(scored), score_mask=scored).logprobs[scored]
    engine_logprobs = torch.tensor(generation.logprobs)
    torch.testing.assert_close(engine_logprobs, trainer, rtol=0, atol=1e-5)
    assert (engine_logprobs - base).abs().max() > 1e-2


SMALL = [
    "rollout.groups=2",
    "rollout.group_size=4",
    "rollout.max_turns=1",
    "rollout.max_new_tokens=24",
    "validation.num_envs=0",
    "diagnostics.every_n_iterations=0",
    "optim.num_minibatches=2",
    "optim.micro_batch_size=4",
    "trainer.checkpoint_every=1",
    "algo=ppo",
    "algo.kl_coef=0.05",
    "filter.strategy=none",
]


def _fit(out: Path, *extra: str) -> Path:
    """A LoRA run of the shipped tiny model into `out`; returns its last.ckpt."""
    from ragen_lit.cli import fit

    fit(load_config(str(ROOT / "conf" / "frozenlake.yaml"), [*LORA, *SMALL, f"logging.output_dir={out}", *extra]))
    (last,) = out.glob("frozenlake-*/checkpoints/last.ckpt")
    return last


def _checkpoint(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


@pytest.mark.slow
def test_checkpoints_hold_adapters_resume_continues_exactly_and_export_merges(tmp_path):
    straight = _checkpoint(_fit(tmp_path / "straight", "trainer.iterations=2"))
    keys = set(straight["state_dict"])
    module = _module("algo=ppo")
    weights = [
        (f"{m}.{n}", p)
        for m in ("policy", "critic")
        for n, p in getattr(module, m).named_parameters(remove_duplicate=False)
    ]
    frozen = {name for name, p in weights if not p.requires_grad}
    assert {name for name, p in weights if p.requires_grad} <= keys  # the adapters and the value head
    assert keys == set(module.state_dict()) - frozen  # and the metric states; not one frozen base weight

    resumed_dir = tmp_path / "resumed"
    _fit(resumed_dir, "trainer.iterations=1")
    resumed = _checkpoint(_fit(resumed_dir, "trainer.iterations=2", "trainer.resume=last"))
    assert resumed["epoch"] == straight["epoch"] and resumed["global_step"] == straight["global_step"] > 0
    for key, value in straight["state_dict"].items():
        torch.testing.assert_close(resumed["state_dict"][key], value, rtol=0, atol=0, equal_nan=True, msg=key)
    for got, want in zip(resumed["optimizer_states"], straight["optimizer_states"], strict=True):
        for index, state in want["state"].items():
            for name, value in state.items():
                torch.testing.assert_close(got["state"][index][name], value, rtol=0, atol=0, msg=f"{index} {name}")

    from transformers import AutoModelForCausalLM

    from ragen_lit.cli import main

    run = next((tmp_path / "straight").glob("frozenlake-*"))
    assert main(["export", str(run), "--out", str(tmp_path / "exported")]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "exported").eval()
    adapters = {k.removeprefix("policy."): v for k, v in straight["state_dict"].items() if k.startswith("policy.")}
    module.policy.load_state_dict(adapters, strict=False)
    ids = torch.tensor([[5, 17, 90, 33, 12, 48, 7, 100]])
    with torch.no_grad():
        trained = module.policy(input_ids=ids).logits
        torch.testing.assert_close(exported(ids).logits, trained, rtol=1e-5, atol=1e-5)
        with module.policy.disable_adapter():
            assert not torch.allclose(exported(ids).logits, module.policy(input_ids=ids).logits, atol=1e-3)
