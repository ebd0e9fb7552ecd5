"""`trainer.strategy=fsdp` on 2 gloo ranks (CPU), against the single-process module on the same rows.

The parent process prepares one batch and takes one update with the plain (unsharded) `AgentRLModule`
(PPO: policy + critic, KL to the frozen reference, all three sharded under FSDP). Two spawned ranks
then shard the same module with FSDP2 and, with the rows split between them, must reproduce to 1e-6:
the per-row old/ref log-probs and values of `prepare_batch`, the policy and critic weights after one
`update` (SGD lr 1, so the step *is* the clipped summed gradient; a clip that bites checks the
global grad norm), the recorded grad norms, the refreshed inference replica, and the gradient-bucket
norms. Split A gives the ranks 2 and 1 micro-batches (one dummy), split B gives rank 1 no rows at
all (every forward and backward of rank 1 is a dummy).

CI runs it on CPU with gloo; `RAGEN_LIT_TEST_DEVICE=cuda` runs the same check with NCCL on 2 GPUs (`ranks.py`).
"""

from __future__ import annotations

import pytest
import torch
from tests.parallel.ranks import assert_close, close, init_rank, reference_device, require_ranks

from ragen_lit.config import load_config
from ragen_lit.training.batch import select_rows

ROWS = 6
SPLITS = {"A": ([0, 1, 2, 3], [4, 5]), "B": ([0, 1, 2, 3, 4, 5], [])}
BUCKETS = torch.tensor([0, 0, 1, 1, 2, 2])  # split A: bucket 2 only on rank 1, buckets 0/1 only on rank 0


def _cfg(model_dir, *extra):
    return load_config(
        None,
        [
            f"model.path={model_dir}",
            "model.dtype=float32",
            "algo=ppo",
            "algo.kl_coef=0.05",
            "algo.entropy_coef=0.01",
            "optim.micro_batch_size=2",
            "optim.grad_clip=0.05",
            "trainer.threads=1",
            *extra,
        ],
    )


def _raw_batch(pad_token_id: int, vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([20, 14, 17, 9, 20, 12])
    T = int(lengths.max())
    positions = torch.arange(T)
    attention_mask = positions < lengths[:, None]
    input_ids = torch.randint(3, vocab, (ROWS, T), generator=g).masked_fill(~attention_mask, pad_token_id)
    loss_mask = attention_mask & (positions >= 5)
    last = torch.nn.functional.one_hot(lengths - 1, T).bool()
    scores = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.0, 0.2])
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "loss_mask": loss_mask,
        "sample_logprobs": torch.zeros(ROWS, T),
        "token_rewards": last.float() * scores[:, None],
        "turn_end_mask": last,
        "scores": scores,
        "group_ids": torch.tensor([0, 0, 1, 1, 2, 2]),
    }


def _sgd(module):
    models = [module.policy, module.critic]
    optimizers = [torch.optim.SGD(m.parameters(), lr=1.0) for m in models]
    return optimizers, [torch.optim.lr_scheduler.LambdaLR(o, lambda _: 1.0) for o in optimizers]


def _full_weights(model) -> dict[str, torch.Tensor]:
    from ragen_lit.parallel.collectives import full_tensor

    return {n: full_tensor(p.detach()).cpu().clone() for n, p in model.named_parameters()}


def _to(batch: dict[str, torch.Tensor] | None, device) -> dict[str, torch.Tensor] | None:
    return None if batch is None else {k: v.to(device) for k, v in batch.items()}


def _reference(cfg, device: torch.device) -> dict:
    """Everything the single process computes on all rows."""
    from ragen_lit.training.module import AgentRLModule, attach_fabric
    from ragen_lit.training.sections import ModuleSections

    module = attach_fabric(AgentRLModule(ModuleSections.of(cfg)).to(device))  # `update` without a Trainer
    module.on_fit_start()  # the frozen reference follows the module's device
    raw = _raw_batch(module.pad_token_id, module.policy.config.vocab_size)
    prepared = {k: v.clone() for k, v in raw.items()}
    module.prepare_batch(prepared, keep_ratio=1.0)
    buckets = module.gradient_bucket_norms(prepared, BUCKETS, 3)
    module.update(prepared, *_sgd(module))
    return {
        "raw": raw,
        "prepared": _to(prepared, "cpu"),
        "buckets": buckets,
        "stats": module.pop_step_stats(),
        "policy": _full_weights(module.policy),
        "critic": _full_weights(module.critic),
    }


def _worker(rank: int, world: int, port: int, model_dir: str, expected_path: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from ragen_lit.training.module import AgentRLModule, attach_fabric
    from ragen_lit.training.sections import ModuleSections

    device = init_rank(rank, world, port)
    try:
        expected = torch.load(expected_path, weights_only=False)
        mesh = init_device_mesh(device.type, (world, 1), mesh_dim_names=("data_parallel", "tensor_parallel"))
        for split, rows_of_rank in SPLITS.items():
            # as under Lightning: shard on the host-loaded module, then move the rest to the device
            module = AgentRLModule(ModuleSections.of(_cfg(model_dir, "trainer.strategy=fsdp")))
            module._device_mesh = mesh
            module.configure_model()
            attach_fabric(module.to(device))
            module.on_fit_start()
            rows = rows_of_rank[rank]
            # prepare_batch: per-row quantities equal the single process's; a rank without rows joins
            mine = select_rows(expected["raw"], rows) if rows else None
            module.prepare_batch(mine, keep_ratio=1.0)
            want = select_rows(expected["prepared"], rows) if rows else None
            if mine is not None:
                for key in ("old_logprobs", "ref_logprobs", "values"):
                    assert_close(mine[key], want[key], msg=f"{split}/{key}")
            # gradient buckets: the all-ranks bucket gradient norm on every rank
            # (a rank without rows still runs the same sharded forwards/backwards, on an empty batch)
            sub = _to(select_rows(expected["prepared"], rows), device)
            buckets = module.gradient_bucket_norms(sub, BUCKETS[rows], 3)
            for key, value in expected["buckets"].items():
                assert close(buckets[key], value, rel=1e-5), (split, key, buckets[key], value)
            # one update on the prepared rows: weights equal the single-process step
            module.update(_to(want, device), *_sgd(module))
            stats = module.pop_step_stats()
            for key in ("actor/grad_norm", "critic/grad_norm"):
                assert close(stats[key], expected["stats"][key], rel=1e-5), (split, key)
            for name in ("policy", "critic"):
                got = _full_weights(getattr(module, name))
                for key, value in expected[name].items():
                    assert_close(got[key], value, msg=f"{split}/{name}/{key}")
            replica = dict(module.inference_policy().named_parameters())
            for key, value in expected["policy"].items():
                assert_close(replica[key], value, msg=f"{split}/replica/{key}")
            dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_fsdp_step_equals_single_process_step(tmp_path, tiny_model_dir, free_port):
    import torch.multiprocessing as mp

    require_ranks(2)
    torch.manual_seed(0)
    expected = _reference(_cfg(tiny_model_dir), reference_device())
    # the clip must bite, or the global-norm check would be vacuous
    assert expected["stats"]["actor/grad_norm"] > 0.05
    path = tmp_path / "expected.pt"
    torch.save(expected, path)
    mp.spawn(_worker, args=(2, free_port, str(tiny_model_dir), str(path)), nprocs=2, join=True)


def test_host_masks_reach_the_sharded_scorer_on_the_host(monkeypatch):
    """FSDP2's root copies every tensor in its forward's arguments to its GPU before the forward
    (`torch.distributed.utils._to_kwargs`, into tuples, lists, dicts and named tuples); the micro-batch's host copies
    of its masks must reach `token_logprobs` on the host all the same. The copy runs here towards the meta device
    (on a CPU, FSDP's own device is the host and moves nothing)."""
    from types import SimpleNamespace

    from torch.distributed.utils import _to_kwargs

    from ragen_lit.parallel import fsdp
    from ragen_lit.training.module import AgentRLModule
    from ragen_lit.training.sections import ModuleSections

    seen = {}

    def record(model, input_ids, attention_mask, **kwargs):
        host = kwargs["host_masks"]
        seen.update(ids=input_ids.device, masks=(host.attention_mask.device, host.score_mask.device))

    monkeypatch.setattr(fsdp, "token_logprobs", record)
    scorer = fsdp.TokenScorer(torch.nn.Linear(1, 1))
    scorer.register_forward_pre_hook(
        lambda _, args, kwargs: tuple(x[0] for x in _to_kwargs(args, kwargs, torch.device("meta"), False)),
        with_kwargs=True,
    )
    module = SimpleNamespace(
        cfg=ModuleSections.of(load_config(None, [])),
        sharded=True,
        compiled=False,
        _fsdp=SimpleNamespace(scorer=lambda model: scorer),
    )
    mask = torch.ones(2, 3, dtype=torch.bool)
    batch = {"input_ids": torch.zeros(2, 3, dtype=torch.long), "attention_mask": mask, "loss_mask": mask}
    batch.update(host_attention_mask=mask.clone(), host_loss_mask=mask.clone())
    AgentRLModule._logprobs(module, None, batch)
    assert seen == {"ids": torch.device("meta"), "masks": (torch.device("cpu"), torch.device("cpu"))}


def test_fsdp_config_checks():
    from ragen_lit.config import ConfigError

    with pytest.raises(ConfigError, match="needs trainer.strategy=fsdp"):
        load_config(None, ["trainer.fsdp_param_dtype=bfloat16"])
    cfg = load_config(
        None, ["trainer.strategy=fsdp", "trainer.fsdp_param_dtype=bfloat16", "trainer.fsdp_reduce_dtype=float32"]
    )
    from ragen_lit.parallel.strategy import FSDPStrategy, choose_strategy

    strategy = choose_strategy(cfg.trainer)
    assert isinstance(strategy, FSDPStrategy) and strategy._timeout.total_seconds() == 60 * cfg.trainer.timeout_minutes


def test_resume_finds_sharded_checkpoint_folders(tmp_path):
    """`trainer.resume=last` and a resume path accept FSDP's checkpoint folders (newest by its files)."""
    import time

    from ragen_lit.config import ConfigError
    from ragen_lit.run.folder import default_run_name, resolve_run_dir

    def resolve(cfg):
        return resolve_run_dir(cfg.logging, cfg.trainer, default_run_name(cfg))

    folders = []
    for name in ("frozenlake-ppo-top_p0.9-20260101-120000", "frozenlake-ppo-top_p0.9-20260101-120000-1"):
        ckpt = tmp_path / name / "checkpoints" / "last.ckpt"
        ckpt.mkdir(parents=True)
        folders.append(ckpt)
    for ckpt in (folders[1], folders[0]):  # run a's checkpoint is written last
        (ckpt / "meta.pt").write_bytes(b"x")
        time.sleep(0.05)
    fsdp = [f"logging.output_dir={tmp_path}", "trainer.strategy=fsdp"]
    run_dir, ckpt, _ = resolve(load_config(None, [*fsdp, "trainer.resume=last"]))
    assert run_dir == folders[0].parent.parent and ckpt == str(folders[0])
    run_dir, ckpt, _ = resolve(load_config(None, [*fsdp, f"trainer.resume={folders[1]}"]))
    assert run_dir == folders[1].parent.parent
    with pytest.raises(ConfigError, match="resume it with trainer.strategy=fsdp"):
        resolve(load_config(None, [f"logging.output_dir={tmp_path}", "trainer.resume=last"]))


@pytest.mark.parametrize(
    "overrides, devices, expected",
    [
        ([], None, "auto"),
        (["trainer.devices=3"], None, "ddp"),
        ([], [0, 1], "ddp"),
        (["trainer.num_nodes=2"], None, "ddp"),
        (["trainer.strategy=ddp"], None, "ddp"),
        (["trainer.strategy=fsdp", "trainer.devices=3"], None, "fsdp"),
    ],
)
def test_auto_strategy_takes_the_projects_ddp_for_several_devices(overrides, devices, expected):
    """Lightning's own DDP (its `auto` pick for several devices) aborts on the RL update's collectives."""
    from ragen_lit.parallel.strategy import FSDPStrategy, ManualSyncDDPStrategy, choose_strategy

    cfg = load_config(None, ["trainer.accelerator=cpu", *overrides])
    if devices is not None:
        cfg.trainer.devices = devices  # a list of device ids, as Lightning takes it
    strategy = choose_strategy(cfg.trainer)
    if expected == "auto":
        assert strategy == "auto"
    else:
        kind = {"ddp": ManualSyncDDPStrategy, "fsdp": FSDPStrategy}[expected]
        assert type(strategy) is kind
