"""2 gloo ranks (plain data parallel) run `prepare_batch` + `update` on their own rows, against one process on
all rows, for every algorithm preset.

Unlike `test_fsdp.py`, which hands each rank the single process's advantages, each rank here computes its own
advantages from its own rows, as in a run: the GAE presets (ppo, dapo) whiten them, and whitening over one
rank's rows instead of the whole batch's moves them (and so the update). The rows are split by group (as
`train_seeds` deals them), so GRPO's group baselines are whole on each rank. Split A gives rank 0 groups 0 and
1 and rank 1 group 2; split B gives rank 1 no rows at all (it takes `prepare_batch(None)` / `update(None)`).
Advantages and the weights after one SGD step (lr 1, so the step is the gradient) must equal the single
process's to float32 precision (on GPUs, `RAGEN_LIT_TEST_DEVICE=cuda`, within bfloat16's tolerance: `ranks.py`).
"""

from __future__ import annotations

import pytest
import torch
from tests.parallel.ranks import assert_close, init_rank, reference_device, require_ranks
from tests.parallel.test_fsdp import _full_weights, _raw_batch

from ragen_lit.config import load_config
from ragen_lit.training.batch import select_rows

PRESETS = ("ppo", "dapo", "grpo", "drgrpo")
SPLITS = {"A": ([0, 1, 2, 3], [4, 5]), "B": ([0, 1, 2, 3, 4, 5], [])}


def _cfg(model_dir, preset, extra=()):
    return load_config(
        None,
        [
            f"model.path={model_dir}",
            "model.dtype=float32",
            f"algo={preset}",
            "algo.kl_coef=0.05",
            "optim.micro_batch_size=2",
            "trainer.threads=1",
            *extra,
        ],
    )


def _models(module):
    return [m for m in (module.policy, module.critic) if m is not None]


def _sgd(module):
    optimizers = [torch.optim.SGD(m.parameters(), lr=1.0) for m in _models(module)]
    return optimizers, [torch.optim.lr_scheduler.LambdaLR(o, lambda _: 1.0) for o in optimizers]


def _module(model_dir, preset, extra=(), device=None):
    from ragen_lit.training.module import AgentRLModule, attach_fabric
    from ragen_lit.training.sections import ModuleSections

    torch.manual_seed(0)
    module = AgentRLModule(ModuleSections.of(_cfg(model_dir, preset, extra))).to(device or reference_device())
    attach_fabric(module)  # `update` without a Trainer
    module.on_fit_start()
    return module


def _run(module, raw):
    """prepare_batch + one update on `raw` (None: no rows here); the advantages and the weights after."""
    batch = None if raw is None else {k: v.to(module.device, copy=True) for k, v in raw.items()}
    module.prepare_batch(batch, keep_ratio=1.0)
    module.update(batch, *_sgd(module))
    return {
        "advantages": None if batch is None else batch["advantages"].cpu(),
        "weights": [_full_weights(m) for m in _models(module)],
    }


def _worker(rank: int, world: int, port: int, model_dir: str, expected_path: str, presets=PRESETS, extra=()) -> None:
    import torch.distributed as dist

    device = init_rank(rank, world, port)
    try:
        expected = torch.load(expected_path, weights_only=False)
        for preset in presets:
            for split, rows_of_rank in SPLITS.items():
                if preset != "ppo" and split == "B":
                    continue  # the rank without rows takes the same path for every preset
                rows = rows_of_rank[rank]
                mine = select_rows(expected["raw"], rows) if rows else None
                module = _module(model_dir, preset, extra, device)
                got = _run(module, mine)
                stats = module.pop_step_stats()
                # the busiest rank's trained tokens over the mean (split B: rank 0 trains all, twice the mean)
                tokens = [float(expected["raw"]["loss_mask"][r].sum()) for r in rows_of_rank]
                assert stats["parallel/token_imbalance"] == pytest.approx(max(tokens) * 2 / sum(tokens))
                assert stats["time/gradient_sum_s"] > 0
                want = expected[preset]
                if rows:
                    assert_close(got["advantages"], want["advantages"][rows], msg=f"{preset}/{split}")
                for got_model, want_model in zip(got["weights"], want["weights"], strict=True):
                    for key, value in want_model.items():
                        assert_close(got_model[key], value, msg=f"{preset}/{split}/{key}")
        # no rank tears the group down while the other still talks to it (gloo aborts)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_data_parallel_update_equals_single_process_update(tmp_path, tiny_model_dir, free_port):
    import torch.multiprocessing as mp

    require_ranks(2)
    expected = {}
    for preset in PRESETS:
        module = _module(tiny_model_dir, preset)
        expected["raw"] = _raw_batch(module.pad_token_id, module.policy.config.vocab_size)
        expected[preset] = _run(module, expected["raw"])
    # each half's own whitening would differ from the whole batch's: the check below could fail
    ppo = expected["ppo"]["advantages"]
    assert (ppo[:4] != 0).any() and (ppo[4:] != 0).any()
    path = tmp_path / "expected.pt"
    torch.save(expected, path)
    mp.spawn(_worker, args=(2, free_port, str(tiny_model_dir), str(path)), nprocs=2, join=True)


# LoRA under data parallel: the adapters (all that has gradients) are summed over ranks like full weights; PPO for
# the critic's adapters and value head, kl_coef > 0 for the adapter-free reference
LORA = ("model.lora.r=4",)


@pytest.mark.slow
def test_data_parallel_lora_update_equals_single_process_update(tmp_path, tiny_model_dir, free_port):
    import torch.multiprocessing as mp

    require_ranks(2)
    module = _module(tiny_model_dir, "ppo", LORA)
    raw = _raw_batch(module.pad_token_id, module.policy.config.vocab_size)
    expected = {"raw": raw, "ppo": _run(module, raw)}
    path = tmp_path / "expected.pt"
    torch.save(expected, path)
    mp.spawn(_worker, args=(2, free_port, str(tiny_model_dir), str(path), ("ppo",), LORA), nprocs=2, join=True)


# one optimizer step per iteration: each rank's update computes its own old log-probs (optim.old_logprobs_from_update)
ONE_STEP = ("optim.num_minibatches=1",)


@pytest.mark.slow
def test_data_parallel_update_with_its_own_old_logprobs_equals_a_separate_pass(tmp_path, tiny_model_dir, free_port):
    """Each rank's update scores its old log-probs itself (split B: a rank without rows joins with none), and the
    advantages and weights after equal the single process's with the separate prepare pass."""
    import torch.multiprocessing as mp

    require_ranks(2)
    presets = ("ppo", "grpo")
    expected = {}
    for preset in presets:
        assert _module(tiny_model_dir, preset, ONE_STEP).old_logprobs_in_update
        separate = _module(tiny_model_dir, preset, (*ONE_STEP, "optim.old_logprobs_from_update=false"))
        expected["raw"] = _raw_batch(separate.pad_token_id, separate.policy.config.vocab_size)
        expected[preset] = _run(separate, expected["raw"])
    path = tmp_path / "expected.pt"
    torch.save(expected, path)
    mp.spawn(_worker, args=(2, free_port, str(tiny_model_dir), str(path), presets, ONE_STEP), nprocs=2, join=True)
