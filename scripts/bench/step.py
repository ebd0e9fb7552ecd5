"""Step-time benchmark of one ragen_lit RL iteration: FrozenLake, PPO (policy + critic), bf16, one device.

The workload is `conf/frozenlake.yaml` run through the project's own code (`AgentRLModule`,
`RolloutDataModule`, a Lightning `Trainer`), with five changes, all printed:

* `algo=ppo`: the policy and a critic of the same backbone are trained (the shipped config uses GRPO,
  which has no critic; PPO is the heavier step and times the value passes too);

* the model is a randomly initialised Qwen2 of the Qwen2.5-0.5B shape (bf16; `--model qwen2.5-3b`: the paper's
  size), saved with a byte-level BPE trained offline on environment text (`ragen_lit.presets.tiny.tokenizer`;
  its ~1.5k ids fit the 151,936-row vocabulary). A random model practically never samples `</answer>` or
  `<|im_end|>` (2 of 151,936 ids), so every turn runs to `max_new_tokens` and every episode to `max_turns`: a
  fixed, reproducible workload (the sampled and sequence token counts are printed);
* `filter.strategy=none`: a random model's rewards are all equal (every turn gets the format
  penalty), so top_p would keep nothing and there would be no update; the update trains on all rollouts;
* `diagnostics.every_n_iterations=2`, so that iteration 2 measures one warm diagnostics iteration; its
  cost is amortised over the config's own schedule (every 5 iterations). A random model writes no
  `<think>…</think>`, so before each diagnostics call every turn gets a synthetic reasoning of about
  as many tokens as the turn sampled (`add_synthetic_reasoning`): an upper bound on real reasoning;
* validation, logging and checkpoints are off (not part of a training step).

Iteration 0 is warm-up; the step time is the mean of the later iterations. Afterwards, on the last
iteration's rollouts (`bench.step_baselines`): the old-log-prob / value split of
`prepare_batch` (re-run with the same calls), the engine alone on the same prompts (the rollout's own
cache kind, `rollout.hf_cache=auto`: "graph" on a GPU; `--engines` adds others, `vllm` the vLLM engine loaded with
the policy's weights), transformers' `generate`
on those prompts (DynamicCache; with `--hf-static` also its static cache, which transformers compiles
with CUDA graphs on a GPU), a plain HF update (policy `model(input_ids, labels=...)` cross-entropy
instead of the PPO loss, eager layers) on the same mini-batches, and optionally an operator profile.
`--set key=value ...` changes the config (e.g. `rollout.exact=true`; `rollout.engine=vllm` rolls out with vLLM, whose
weights and KV cache then count in every phase's peak memory: they stay allocated in this process).
`--profile-phases` runs one more iteration whose generation, diagnostics (when that iteration is a diagnostics one:
an even count of --iterations) and first update mini-batch run under the profiler (`bench.profiling`: kernels by
family and the device's busy fraction, inside the pipeline as it runs); that iteration is left out of the means.

Update MFU = model FLOPs / update time / 989 TFLOP/s (H100 SXM dense bf16), with the model FLOPs of
`bench.common.update_flops` (padding and recomputation not counted; under LoRA only the adapters'
weight gradients are counted, the frozen weights' forward and activation gradients still are).
Entry point: `scripts/bench_step.py`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import lightning as L
import torch
import transformers

from bench.common import (
    CONFIG,
    PEAK_FLOPS,
    SMOKE_OVERRIDES,
    Clock,
    device_name,
    module_weights,
    progress,
    update_flops,
)
from bench.machine import utc_now
from bench.profiling import format_breakdown, start_profiler, stop_profiler
from bench.random_model import DEFAULT_SHAPE, QWEN_SHAPES, SMOKE, write_random_model
from bench.roofline import decode_workload, model_roofline
from bench.step_baselines import (
    engine_generation,
    hf_generate,
    plain_hf_update,
    prepare_split,
    profile_micro_batch,
    rollout_params,
    turn_prompts,
)
from bench.step_report import format_table
from bench.trl_baseline import trl_available, trl_grpo_step
from ragen_lit.config import load_config
from ragen_lit.engines import build_engine
from ragen_lit.engines.hf import HFEngine
from ragen_lit.training.batch import micro_batch_rows
from ragen_lit.training.data import RolloutDataModule
from ragen_lit.training.module import AgentRLModule
from ragen_lit.training.sections import DataSections, ModuleSections

DIAGNOSTICS_EVERY = 2  # the bench's schedule: iteration 2 is a warm diagnostics iteration
# --shape: config overrides on top of the bench's own. "trl": the single-turn GRPO shape of TRL's GRPOTrainer
# comparison (8 prompts x 16 completions of 128 tokens, one optimizer step per iteration, micro-batches of 32 rows
# as TRL's per_device_train_batch_size), run with --iterations 4 --no-diagnostics unless given
SHAPES = {
    "multi-turn": [],
    "trl": [
        "rollout.max_turns=1",
        "rollout.max_new_tokens=128",
        "rollout.groups=8",
        "rollout.group_size=16",
        "algo=grpo",
        "optim.num_minibatches=1",
        "optim.micro_batch_size=32",
        "model.compile=true",
    ],
}


def add_synthetic_reasoning(trajectories, tokenizer) -> None:
    """Give every turn without reasoning the text of its own sampled ids, each folded onto one of the
    tokenizer's ids whose text re-encodes as that id alone, so the reasoning has about as many tokens
    as the turn (a byte fragment would decode to U+FFFD and re-encode as three tokens)."""
    clean = [
        i for i in range(len(tokenizer)) if tokenizer.encode(tokenizer.decode([i]), add_special_tokens=False) == [i]
    ]
    for traj in trajectories:
        for turn in traj.turns:
            if turn.reasoning is None:
                ids = [clean[i % len(clean)] for i in traj.token_ids[turn.prompt_end : turn.response_end]]
                turn.reasoning = tokenizer.decode(ids) or "x"


class PipelineProbe(L.Callback):
    """Times generation, diagnostics and prepare_batch (by wrapping the module's and data module's own
    methods) and the update (Lightning batch hooks); keeps the last iteration's rollouts and mini-batches."""

    def __init__(
        self, clock: Clock, module: AgentRLModule, data: RolloutDataModule, profile_iteration: int | None = None
    ):
        self.clock = clock
        # `profile_iteration`: its generation, diagnostics (if due) and first mini-batch's update run under the profiler
        self.profile_iteration = profile_iteration
        self.phase_profiles: dict[str, dict] = {}
        self._profiler = None
        self.trajectories = []
        self.sampled: dict[int, int] = {}  # per iteration: the tokens its rollouts sampled
        self.minibatches = []
        self.update_masks: dict[int, list[dict]] = defaultdict(list)  # per iteration: what the FLOP count needs
        self.epoch_ends: dict[int, float] = {}
        self.reasoning_tokens: list[int] = []
        self.scoring_seconds: dict[str, float] = {}  # diagnostics_scoring_s: the last diagnostics' scoring seconds
        run_rollouts, diagnostics, prepare = data.run_rollouts, module.collapse_diagnostics, module.prepare_batch

        def epoch() -> int:
            return module.trainer.current_epoch

        def timed_rollouts(*args, **kwargs):
            profiler = start_profiler(clock.device) if epoch() == self.profile_iteration else None
            with clock.phase("generation", epoch()):
                self.trajectories = run_rollouts(*args, **kwargs)
            self.sampled[epoch()] = sum(sum(t.loss_mask) for t in self.trajectories)
            if profiler is not None:
                self.phase_profiles["generation"] = stop_profiler(profiler, clock.seconds[epoch()]["generation"])
            return self.trajectories

        def timed_diagnostics(trajectories, iteration):
            due = module.collapse.due(iteration)
            if due:
                add_synthetic_reasoning(trajectories, module.tokenizer)
                self.reasoning_tokens = [
                    len(module.chat.encode(turn.reasoning)) for t in trajectories for turn in t.turns
                ]
            profiler = None
            if epoch() == self.profile_iteration and due:
                profiler = start_profiler(clock.device)
            with clock.phase("diagnostics", epoch()):
                values = diagnostics(trajectories, iteration)
            if profiler is not None:
                self.phase_profiles["diagnostics"] = stop_profiler(profiler, clock.seconds[epoch()]["diagnostics"])
            if values and profiler is None:  # a measured diagnostics iteration: how much of it the scoring took
                self.scoring_seconds = {k.removeprefix("time/"): v for k, v in values.items() if k.startswith("time/")}
            return values

        def timed_prepare(batch, keep_ratio):
            with clock.phase("prepare", epoch()):
                return prepare(batch, keep_ratio)

        data.run_rollouts = timed_rollouts
        module.collapse_diagnostics, module.prepare_batch = timed_diagnostics, timed_prepare

    def on_train_epoch_start(self, trainer, module):
        self.minibatches = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.minibatches.append(batch)
        if "attention_mask" in batch:
            masks = {k: batch[k].cpu() for k in ("attention_mask", "loss_mask")}
            self.update_masks[trainer.current_epoch].append(masks)
        self.clock.start("update")
        if trainer.current_epoch == self.profile_iteration and batch_idx == 0:
            self._profiler = start_profiler(self.clock.device)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        seconds = self.clock.stop("update", trainer.current_epoch)
        if self._profiler is not None:
            self.phase_profiles["update"] = stop_profiler(self._profiler, seconds)
            self._profiler = None

    def on_train_epoch_end(self, trainer, module):
        self.clock.sync()
        self.epoch_ends[trainer.current_epoch] = time.perf_counter()
        spent = self.clock.seconds[trainer.current_epoch]
        progress(f"iteration {trainer.current_epoch}: " + ", ".join(f"{k} {v:.2f}s" for k, v in spent.items()))


def turn_calls(trajectories) -> list[tuple[list[int], list[int]]]:
    """Per turn (one engine call), the prompt length and the sampled token count of every episode still running."""
    most = max(len(t.turns) for t in trajectories)
    return [
        (
            [t.turns[k].prompt_end for t in trajectories if len(t.turns) > k],
            [t.turns[k].response_end - t.turns[k].prompt_end for t in trajectories if len(t.turns) > k],
        )
        for k in range(most)
    ]


def run(args, save) -> dict:
    """The pipeline, then the baselines; `save(results)` is called after every stage (partial results
    survive a timeout). The model folder lives until the end (TRL loads it too)."""
    with tempfile.TemporaryDirectory(prefix="bench-step-") as folder:
        return _run(args, save, folder)


def _run(args, save, folder: str) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    base = load_config(str(CONFIG))
    model_config = write_random_model(Path(folder), args.model, device)
    overrides = (
        [
            "model.name=hf",
            f"model.path={folder}",
            "algo=ppo",
            "filter.strategy=none",
            f"diagnostics.every_n_iterations={0 if args.no_diagnostics else DIAGNOSTICS_EVERY}",
            # --profile-phases: one more iteration, run under the profiler and left out of the means
            f"trainer.iterations={args.iterations + args.profile_phases}",
            f"trainer.accelerator={'gpu' if device.type == 'cuda' else 'cpu'}",
        ]
        + (SMOKE_OVERRIDES if args.smoke else ["model.dtype=bfloat16"])
        + SHAPES[args.shape]
        + args.set
    )
    cfg = load_config(str(CONFIG), overrides)
    if cfg.trainer.threads:
        torch.set_num_threads(cfg.trainer.threads)
    L.seed_everything(cfg.trainer.seed, verbose=False)
    module = AgentRLModule(ModuleSections.of(cfg))
    data = RolloutDataModule(DataSections.of(cfg))
    progress(f"model written to {folder} and loaded; fit of {args.iterations} iterations")
    clock = Clock(device)
    probe = PipelineProbe(clock, module, data, profile_iteration=args.iterations if args.profile_phases else None)
    trainer = L.Trainer(
        max_epochs=cfg.trainer.iterations,
        accelerator=cfg.trainer.accelerator,
        devices=1,
        precision=cfg.trainer.precision,
        logger=False,
        callbacks=[probe],
        reload_dataloaders_every_n_epochs=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        use_distributed_sampler=False,
    )
    trainer.fit(module, datamodule=data)
    module.to(device)  # Lightning's teardown leaves the module on the CPU

    steady = list(range(1, args.iterations))
    phases = ("generation", "diagnostics", "prepare", "update")
    per_iteration = []
    for it in range(args.iterations):
        row = {p: clock.seconds[it].get(p, 0.0) for p in phases}
        if it in probe.epoch_ends and it - 1 in probe.epoch_ends:
            row["wall"] = probe.epoch_ends[it] - probe.epoch_ends[it - 1]
            row["other"] = row["wall"] - sum(row[p] for p in phases)
        per_iteration.append(row)
    mean = {
        k: sum(per_iteration[i][k] for i in steady) / len(steady) for k in ("generation", "prepare", "update", "other")
    }
    diag_iterations = [] if args.no_diagnostics else [i for i in steady if i % DIAGNOSTICS_EVERY == 0]
    diagnostics_s = float("nan")
    if diag_iterations:
        diagnostics_s = sum(per_iteration[i]["diagnostics"] for i in diag_iterations) / len(diag_iterations)
    every = base.diagnostics.every_n_iterations
    amortised = diagnostics_s / every if every else 0.0
    step_s = mean["generation"] + mean["prepare"] + mean["update"] + mean["other"]
    step_s += 0.0 if args.no_diagnostics else amortised

    trajectories = probe.trajectories
    sampled = sum(sum(t.loss_mask) for t in trajectories)
    tokens = sum(len(t.token_ids) for t in trajectories)
    reasoning_tokens = probe.reasoning_tokens
    policy_weights, critic_weights = module_weights(module)
    # per steady iteration: its own mini-batches' FLOPs over its own update time (the mean, not one iteration)
    counts = [update_flops(model_config, probe.update_masks[i], policy_weights, critic_weights) for i in steady]
    flops, naive_flops = (sum(c[k] for c in counts) / len(steady) for k in (0, 1))
    trained = sum(int(mb["attention_mask"].sum()) for i in steady for mb in probe.update_masks[i]) / len(steady)
    last = per_iteration[-1]  # the iteration whose rollouts and mini-batches were kept (the baselines)
    peak_flops = PEAK_FLOPS if device.type == "cuda" else float("nan")
    r = cfg.rollout
    results = {
        "device": device_name(device),
        "date": utc_now(),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "lightning": L.__version__,
            "cuda": torch.version.cuda,
        },
        "config": {
            "smoke": args.smoke,
            "model": args.model,
            "shape": args.shape,
            "iterations": args.iterations,
            "policy_params": policy_weights.total,
            "policy_trainable_params": policy_weights.trainable,
            "critic_params": critic_weights.total if critic_weights else None,
            "critic_trainable_params": critic_weights.trainable if critic_weights else None,
            "hidden_size": model_config.hidden_size,
            "layers": model_config.num_hidden_layers,
            "vocab_size": model_config.vocab_size,
            "dtype": str(next(module.policy.parameters()).dtype).removeprefix("torch."),
            "attention": module.policy.config._attn_implementation,
            "groups": r.groups,
            "group_size": r.group_size,
            "max_turns": r.max_turns,
            "max_new_tokens": r.max_new_tokens,
            "engine": cfg.rollout.engine,
            "vllm_args": cfg.rollout.vllm_args,
            "algo": cfg.algo.name,
            "advantage": cfg.algo.advantage,
            "num_minibatches": cfg.optim.num_minibatches,
            "micro_batch_size": micro_batch_rows(cfg.optim.micro_batch_size, device),
            "compile": module.compiled,
            "exact": cfg.rollout.exact,
            "old_logprobs_in_update": module.old_logprobs_in_update,
            "diagnostics_every_n_iterations": every,
            "diagnostics_num_samples": cfg.diagnostics.num_samples,
        },
        "workload": {
            "rollouts": len(trajectories),
            "turns": sum(len(t.turns) for t in trajectories),
            "sampled_tokens": sampled,
            "sequence_tokens": tokens,
            "mean_sequence_tokens": tokens / len(trajectories),
            "max_sequence_tokens": max(len(t.token_ids) for t in trajectories),
            "diagnostics_reasoning_tokens_mean": sum(reasoning_tokens) / max(len(reasoning_tokens), 1),
        },
        "per_iteration": per_iteration,
        "step": {
            "generation_s": mean["generation"],
            "prepare_s": mean["prepare"],
            "diagnostics_iteration_s": diagnostics_s,
            "diagnostics_amortised_s": amortised,
            **probe.scoring_seconds,  # diagnostics_scoring_s
            "update_s": mean["update"],
            "other_s": mean["other"],
            "step_s": step_s,
            "diagnostics_share": amortised / step_s,
        },
        "throughput": {
            # the steady iterations' sampled tokens over their generation seconds: the same iterations as the
            # seconds column
            "generation_tokens_per_s": sum(probe.sampled[i] for i in steady)
            / sum(per_iteration[i]["generation"] for i in steady),
            "training_tokens_per_s": trained / mean["update"],
            "last_update_s": last["update"],
            "update_flops": flops,
            "update_mfu": flops / mean["update"] / peak_flops,
            "update_mfu_naive_count": naive_flops / mean["update"] / peak_flops,
        },
        "roofline": dataclasses.asdict(
            model_roofline(module.policy, decode_workload(turn_calls(trajectories)), device_name(device))
        ),
        "peak_memory_gib": {k: v / 2**30 for k, v in clock.peak_bytes.items()},
        "alloc_retries": dict(clock.alloc_retries),
        "baselines": {},
        "profile": None,
        "phase_profiles": probe.phase_profiles,
    }
    save(results)
    progress("pipeline done: " + json.dumps({k: round(v, 3) for k, v in results["step"].items()}))
    if args.trl:
        results["baselines"]["trl"] = trl_comparison(module, trajectories, folder, args.iterations, device)
        save(results)

    if args.pipeline_only:
        return results
    results["step"].update({f"{k}_s": v for k, v in prepare_split(module, trajectories, clock).items()})
    save(results)
    progress("prepare split done")
    b = results["baselines"]
    prompts = turn_prompts(trajectories)
    params = rollout_params(module, seed=0)
    b["engine"] = engine_generation(data.engine, prompts, params, clock, "engine")
    b["engine"]["cache"] = data.engine.cache_kind(device) if isinstance(data.engine, HFEngine) else "vllm"
    save(results)
    progress(f"engine (cache={b['engine']['cache']}) alone: {b['engine']}")
    for kind in args.engines:
        engine = other_engine(kind, cfg, module, data, folder)
        b[f"engine_{kind}"] = engine_generation(engine, prompts, params, clock, f"engine_{kind}")
        b[f"engine_{kind}"]["cache"] = kind
        save(results)
        progress(f"engine (cache={kind}) alone: {b[f'engine_{kind}']}")
    b["hf_generate"] = hf_generate(module.policy, prompts, module.pad_token_id, r.max_new_tokens, clock, "hf_generate")
    save(results)
    progress(f"transformers generate: {b['hf_generate']}")
    try:
        b["plain_update_s"] = plain_hf_update(module, probe.minibatches, clock)
        b["plain_update_mfu"] = flops / b["plain_update_s"] / peak_flops
        progress(f"plain HF update: {b['plain_update_s']:.3f} s")
    except torch.OutOfMemoryError:  # it materialises full-vocabulary logits for every position
        b["plain_update_oom"] = f"out of memory at micro-batch {micro_batch_rows(cfg.optim.micro_batch_size, device)}"
        progress(f"plain HF update: {b['plain_update_oom']}")
        module.policy.zero_grad(set_to_none=True)
        if module.critic is not None:
            module.critic.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
    save(results)
    if args.profile:
        results["profile"] = profile_micro_batch(module, probe.minibatches[0], device)
        save(results)
    if args.hf_static:
        b["hf_generate_static"] = hf_generate(
            module.policy, prompts, module.pad_token_id, r.max_new_tokens, clock, "hf_generate_static", static=True
        )
        save(results)
        progress(f"transformers generate, static cache, compiled: {b['hf_generate_static']}")
    results["peak_memory_gib"] = {k: v / 2**30 for k, v in clock.peak_bytes.items()}
    results["alloc_retries"] = dict(clock.alloc_retries)
    save(results)
    return results


def other_engine(kind: str, cfg, module: AgentRLModule, data: RolloutDataModule, folder: str):
    """A second engine for `--engines KIND` holding the trained policy: the transformers engine with that cache kind
    (on the rollout engine's own copy of the policy when it has one), or `vllm`: the vLLM engine the config's rollout
    section describes, started on the model folder and synced with the policy."""
    if kind == "vllm":
        rollout = dataclasses.replace(cfg.rollout, engine="vllm")
        engine = build_engine(
            rollout, cfg.model, policy=module.policy, model_path=folder, pad_token_id=module.pad_token_id, seed=0
        )
        engine.sync(module.policy)
        return engine
    policy = data.engine.model if isinstance(data.engine, HFEngine) else module.policy
    return HFEngine(policy, pad_token_id=module.pad_token_id, max_batch_size=cfg.rollout.max_batch_size, cache=kind)


def trl_comparison(module, trajectories, folder: str, iterations: int, device: torch.device) -> dict:
    """TRL's GRPOTrainer on the groups' first-turn prompts (as text), the same model folder and shape, or why not."""
    if module.cfg.rollout.max_turns != 1:
        return {"skipped": "TRL's GRPOTrainer is single-turn: run it with --shape trl (rollout.max_turns=1)"}
    if not trl_available():
        return {"skipped": "trl is not importable: pip install trl to time TRL's GRPOTrainer on the same prompts"}
    first_prompts = {}
    for t in trajectories:
        first_prompts.setdefault(t.group, t.token_ids[: t.turns[0].prompt_end])
    prompts = [module.tokenizer.decode(ids) for ids in first_prompts.values()]
    if device.type == "cuda":
        torch.cuda.empty_cache()
    progress(f"TRL GRPOTrainer: {len(prompts)} prompts x {module.cfg.rollout.group_size}, {iterations} steps")
    timing = trl_grpo_step(
        folder,
        prompts,
        group_size=module.cfg.rollout.group_size,
        max_new_tokens=module.cfg.rollout.max_new_tokens,
        steps=iterations,
        device=device,
    )
    progress(f"TRL GRPOTrainer: {timing}")
    return timing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model and batch: checks that the script runs")
    parser.add_argument(
        "--model",
        choices=list(QWEN_SHAPES),
        default=DEFAULT_SHAPE,
        help="the random-init model's architecture (--smoke overrides it with a tiny shape)",
    )
    parser.add_argument(
        "--shape",
        choices=list(SHAPES),
        default="multi-turn",
        help="multi-turn: the FrozenLake PPO step; trl: the single-turn GRPO shape of the TRL comparison "
        "(sets --no-diagnostics, and --iterations 4 unless given)",
    )
    parser.add_argument(
        "--trl",
        action="store_true",
        help="also time TRL's GRPOTrainer on the same prompts, model folder and shape (--shape trl; needs trl)",
    )
    parser.add_argument(
        "--iterations",
        type=int,
        default=None,
        help="RL iterations (>= 3: warm-up, steady, diagnostics; >= 2 with --no-diagnostics); default 3 (trl: 4)",
    )
    parser.add_argument(
        "--no-diagnostics", action="store_true", help="skip the diagnostics measurement (step without them)"
    )
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    parser.add_argument(
        "--engines",
        nargs="*",
        default=[],
        choices=["dynamic", "static", "graph", "vllm"],
        help="also time the transformers engine with these cache kinds, or the vLLM engine (vllm), on the same prompts",
    )
    parser.add_argument(
        "--hf-static",
        action="store_true",
        help="also time transformers generate with its static cache, compiled (a first pass compiles)",
    )
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="config overrides on top of the bench's own (e.g. rollout.exact=true model.compile=false)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="also print an operator profile of one micro-batch of update work"
    )
    parser.add_argument(
        "--profile-phases",
        action="store_true",
        help="run one more iteration with its generation, diagnostics (if due) and update under the profiler (left out "
        "of the means)",
    )
    parser.add_argument(
        "--pipeline-only",
        action="store_true",
        help="stop after the fit: no prepare split, engine, transformers or plain-update baselines",
    )
    args = parser.parse_args(argv)
    if "vllm" in args.engines and load_config(str(CONFIG), args.set).rollout.engine == "vllm":
        parser.error(
            "--engines vllm starts a vLLM engine beside the rollout's, and rollout.engine=vllm already runs one in "
            "this process (its 'engine alone' baseline is vLLM's); drop one of them"
        )
    if args.smoke:
        args.model = SMOKE
    if args.shape == "trl":
        args.no_diagnostics = True
    if args.iterations is None:
        args.iterations = 4 if args.shape == "trl" else 3
    if args.iterations < (2 if args.no_diagnostics else 3):
        raise ValueError(
            "--iterations must be >= 3 (warm-up, a steady step, a diagnostics step; >= 2 with "
            f"--no-diagnostics), got {args.iterations}"
        )

    def save(results: dict) -> None:
        if args.out:
            args.out.write_text(json.dumps(results, indent=2))

    results = run(args, save)
    print(format_table(results))
    for phase, profile in results["phase_profiles"].items():
        label = f"{phase} of iteration {args.iterations} (profiled, not in the means)"
        print("\n".join(["", *format_breakdown(label, profile)]))
    if results["profile"]:
        print(
            "\none micro-batch of update work (token_logprobs + entropy fwd/bwd, critic fwd/bwd):\n"
            + results["profile"]
        )
    return 0
