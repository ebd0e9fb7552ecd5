"""Step-time benchmark of one ragen_lit RL iteration: FrozenLake, PPO (policy + critic), bf16, one device.

    python scripts/bench_step.py --out bench.json          # Qwen2.5-0.5B architecture, random init (issue 6, item 6)
    python scripts/bench_step.py --no-diagnostics --iterations 2 --profile   # the step and baselines only
    python scripts/bench_step.py --set model.compile=true --engines dynamic --hf-static   # compiled update, all engines
    python scripts/bench_step.py --smoke                   # tiny model, small batch: checks the script runs (CPU is fine)

The workload is `conf/frozenlake.yaml` run through the project's own code (`AgentRLModule`,
`RolloutDataModule`, a Lightning `Trainer`), with five changes, all printed:

* `algo=ppo`: the policy and a critic of the same backbone are trained (the shipped config uses GRPO,
  which has no critic; PPO is the heavier step and times the value passes too);

* the model is a randomly initialised Qwen2 of the Qwen2.5-0.5B shape (bf16), saved with a byte-level
  BPE trained offline on environment text (`ragen_lit.presets.tiny.tokenizer`; its ~1.5k ids fit the
  151,936-row vocabulary). A random model practically never samples `</answer>` or `<|im_end|>` (2 of
  151,936 ids), so every turn runs to `max_new_tokens` and every episode to `max_turns`: a fixed,
  reproducible workload (the sampled and sequence token counts are printed);
* `filter.strategy=none`: a random model's rewards are all equal (every turn gets the format
  penalty), so top_p would keep nothing and there would be no update; the update trains on all rollouts;
* `diagnostics.every_n_steps=2`, so that iteration 2 measures one warm diagnostics iteration; its
  cost is amortised over the config's own schedule (every 5 iterations). A random model writes no
  `<think>…</think>`, so before each diagnostics call every turn gets a synthetic reasoning of about
  as many tokens as the turn sampled (`add_synthetic_reasoning`): an upper bound on real reasoning;
* validation, logging and checkpoints are off (not part of a training step).

Iteration 0 is warm-up; the step time is the mean of the later iterations. Afterwards, on the last
iteration's rollouts: the old-log-prob / value split of `prepare_batch` (re-run with the same calls),
the engine alone on the same prompts (the rollout's own cache kind, `rollout.hf_cache=auto`: "graph" on a
GPU; `--engines` adds others), transformers' `generate` on those prompts (DynamicCache; with
`--hf-static` also its static cache, which transformers compiles with CUDA graphs on a GPU), a plain HF
update (policy `model(input_ids, labels=...)` cross-entropy instead of the PPO loss, eager layers) on
the same mini-batches, and optionally an operator profile. `--set key=value ...` changes the config
(e.g. `model.compile=true`).

Update MFU = model FLOPs / update time / 989 TFLOP/s (H100 SXM dense bf16). Model FLOPs, per sequence
of s real tokens of which h are scored (response tokens), L layers, width d, vocabulary V:
policy `6·(N − V·d)·s + 6·V·d·h + 12·L·d·s²`, critic `6·(N_c − V·d)·s + 12·L·d·s²` (N: parameter
count; the tied embedding is a lookup, the head runs on scored positions only; attention counted
PaLM-style as the full s×s score matrix, forward + backward). Padding and recomputation are not counted.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import lightning as L
import torch
import transformers

from ragen_lit.agent.prompts import ANSWER_CLOSE
from ragen_lit.training.batch import collate
from ragen_lit.config import load_config
from ragen_lit.training.data import RolloutDataModule
from ragen_lit.engines.base import SamplingParams
from ragen_lit.engines.hf import HFEngine, left_pad
from ragen_lit.logprobs import token_logprobs
from ragen_lit.training.module import AgentRLModule
from ragen_lit.training.batch import micro_batches  # the update's own slicing (FLOPs count what it runs)
from ragen_lit.presets.tiny.build import TinyRecipe, tokenizer_corpus
from ragen_lit.presets.tiny.tokenizer import train_tokenizer

PEAK_FLOPS = 989e12  # H100 SXM, dense bf16
REPO = Path(__file__).resolve().parents[1]
STARTED = time.perf_counter()
CONFIG = REPO / "conf" / "frozenlake.yaml"
DIAGNOSTICS_EVERY = 2  # the bench's schedule: iteration 2 is a warm diagnostics iteration
SMOKE_OVERRIDES = [
    "rollout.groups=2", "rollout.group_size=4", "rollout.max_turns=2", "rollout.max_new_tokens=8",
    "optim.num_minibatches=2", "optim.micro_batch_size=4", "diagnostics.num_samples=4", "trainer.threads=1",
]


def qwen_config(tokenizer, smoke: bool) -> transformers.Qwen2Config:
    """Qwen2.5-0.5B's shape (random init), or a tiny one with the tokenizer's vocabulary for --smoke."""
    ids = {"bos_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    if smoke:
        return transformers.Qwen2Config(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=len(tokenizer), tie_word_embeddings=True, max_position_embeddings=4096, **ids,
        )
    return transformers.Qwen2Config(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768, rope_theta=1e6, **ids,
    )


def write_random_model(folder: Path, smoke: bool, device: torch.device) -> transformers.Qwen2Config:
    """Save a random-init Qwen2 (bf16) and the env-text tokenizer to `folder`; returns the model config."""
    tokenizer = train_tokenizer(tokenizer_corpus(TinyRecipe()), TinyRecipe().vocab_size)
    config = qwen_config(tokenizer, smoke)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.Qwen2ForCausalLM(config)
    progress(f"random {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M-parameter Qwen2 initialised on {device}")
    model.to(torch.bfloat16).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return config


class Clock:
    """Wall seconds per (iteration, phase) and peak allocated GPU bytes per phase; the device is
    synchronised at both ends of a phase so that queued kernels are charged to the phase that issued them."""

    def __init__(self, device: torch.device):
        self.device = device
        self.seconds: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.peak_bytes: dict[str, int] = defaultdict(int)
        # the caching allocator's failed-then-retried allocations (it freed its cache and synchronised)
        self.alloc_retries: dict[str, int] = defaultdict(int)
        self._started: dict[str, float] = {}
        self._retries_at_start: dict[str, int] = {}

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def start(self, name: str) -> None:
        self.sync()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self._retries_at_start[name] = torch.cuda.memory_stats(self.device).get("num_alloc_retries", 0)
        self._started[name] = time.perf_counter()

    def stop(self, name: str, iteration: int) -> float:
        self.sync()
        elapsed = time.perf_counter() - self._started.pop(name)
        self.seconds[iteration][name] += elapsed
        if self.device.type == "cuda":
            self.peak_bytes[name] = max(self.peak_bytes[name], torch.cuda.max_memory_allocated(self.device))
            retries = torch.cuda.memory_stats(self.device).get("num_alloc_retries", 0)
            self.alloc_retries[name] += retries - self._retries_at_start.pop(name)
        return elapsed

    @contextmanager
    def phase(self, name: str, iteration: int = -1):
        self.start(name)
        try:
            yield
        finally:
            self.stop(name, iteration)


def add_synthetic_reasoning(trajectories, tokenizer) -> None:
    """Give every turn without reasoning the text of its own sampled ids, each folded onto one of the
    tokenizer's ids whose text re-encodes as that id alone, so the reasoning has about as many tokens
    as the turn (a byte fragment would decode to U+FFFD and re-encode as three tokens)."""
    clean = [i for i in range(len(tokenizer)) if tokenizer.encode(tokenizer.decode([i]), add_special_tokens=False) == [i]]
    for traj in trajectories:
        for turn in traj.turns:
            if turn.reasoning is None:
                ids = [clean[i % len(clean)] for i in traj.token_ids[turn.prompt_end:turn.response_end]]
                turn.reasoning = tokenizer.decode(ids) or "x"


class PipelineProbe(L.Callback):
    """Times generation, diagnostics and prepare_batch (by wrapping the module's and data module's own
    methods) and the update (Lightning batch hooks); keeps the last iteration's rollouts and mini-batches."""

    def __init__(self, clock: Clock, module: AgentRLModule, data: RolloutDataModule):
        self.clock = clock
        self.trajectories = []
        self.minibatches = []
        self.update_masks: dict[int, list[dict]] = defaultdict(list)  # per iteration: what the FLOP count needs
        self.epoch_ends: dict[int, float] = {}
        self.reasoning_tokens: list[int] = []
        run_rollouts, diagnostics, prepare = data.run_rollouts, module.collapse_diagnostics, module.prepare_batch

        def epoch() -> int:
            return module.trainer.current_epoch

        def timed_rollouts(*args, **kwargs):
            with clock.phase("generation", epoch()):
                self.trajectories = run_rollouts(*args, **kwargs)
            return self.trajectories

        def timed_diagnostics(trajectories, iteration):
            if module.collapse.due(iteration):
                add_synthetic_reasoning(trajectories, module.tokenizer)
                self.reasoning_tokens = [len(module.chat.encode(turn.reasoning)) for t in trajectories for turn in t.turns]
            with clock.phase("diagnostics", epoch()):
                return diagnostics(trajectories, iteration)

        def timed_prepare(batch, keep_ratio):
            with clock.phase("prepare", epoch()):
                return prepare(batch, keep_ratio)

        data.run_rollouts, module.collapse_diagnostics, module.prepare_batch = timed_rollouts, timed_diagnostics, timed_prepare

    def on_train_epoch_start(self, trainer, module):
        self.minibatches = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.minibatches.append(batch)
        if "attention_mask" in batch:
            self.update_masks[trainer.current_epoch].append({k: batch[k].cpu() for k in ("attention_mask", "loss_mask")})
        self.clock.start("update")

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.clock.stop("update", trainer.current_epoch)

    def on_train_epoch_end(self, trainer, module):
        self.clock.sync()
        self.epoch_ends[trainer.current_epoch] = time.perf_counter()
        spent = self.clock.seconds[trainer.current_epoch]
        progress(f"iteration {trainer.current_epoch}: " + ", ".join(f"{k} {v:.2f}s" for k, v in spent.items()))


def update_flops(config, minibatches, policy_params: int, critic_params: int | None) -> tuple[float, float]:
    """(model FLOPs of one pass over `minibatches`, the naive 6·N·tokens + attention count with N the full
    parameter count of each model); formula in the module docstring."""
    d, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    exact = naive = 0.0
    for mb in minibatches:
        mask = mb["attention_mask"].bool()
        lengths = mask.sum(-1).double()
        tokens = float(lengths.sum())
        scored = float((mb["loss_mask"][:, 1:].bool() & mask[:, :-1]).sum())
        attention = 12.0 * layers * d * float((lengths**2).sum())
        exact += 6.0 * (policy_params - vocab * d) * tokens + 6.0 * vocab * d * scored + attention
        naive += 6.0 * policy_params * tokens + attention
        if critic_params is not None:
            exact += 6.0 * (critic_params - vocab * d) * tokens + attention
            naive += 6.0 * critic_params * tokens + attention
    return exact, naive


def rollout_params(module: AgentRLModule, seed: int) -> SamplingParams:
    """The sampling parameters the rollout loop uses for training turns."""
    r, tokenizer = module.cfg.rollout, module.tokenizer
    stop_ids = [i for i in {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")} if isinstance(i, int) and i >= 0]
    return SamplingParams(
        max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
        stop_sequences=[module.chat.encode(ANSWER_CLOSE)], stop_token_ids=stop_ids, seed=seed,
    )


def turn_prompts(trajectories) -> list[list[list[int]]]:
    """Per turn, the prompts the engine was given (the context up to that turn's `<think>`)."""
    most = max(len(t.turns) for t in trajectories)
    return [[t.token_ids[:t.turns[k].prompt_end] for t in trajectories if len(t.turns) > k] for k in range(most)]


def engine_generation(engine: HFEngine, prompts, params: SamplingParams, clock: Clock, name: str) -> dict:
    tokens = 0
    with clock.phase(name):
        for k, turn in enumerate(prompts):
            params.seed = k
            tokens += sum(len(g.token_ids) for g in engine.generate(turn, params))
    seconds = clock.seconds[-1][name]
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds}


@contextmanager
def plain_layers(*models):
    """The models' decoder layers as transformers wrote them: drops the compiled forwards that
    `model.compile` binds to each layer (`models.compile_layers`) and restores them afterwards."""
    bound = [(m, m.__dict__.pop("forward")) for model in models if model is not None for m in model.modules() if "forward" in m.__dict__]
    try:
        yield
    finally:
        for module, forward in bound:
            module.forward = forward


def hf_generate(model, prompts, pad_token_id: int, max_new_tokens: int, clock: Clock, name: str, static: bool = False) -> dict:
    """transformers' own `generate` (sampling, T=1), exactly max_new_tokens per row: DynamicCache, or
    with `static` its StaticCache, whose forward transformers compiles itself (mode "reduce-overhead":
    CUDA graphs) on a GPU; a first untimed pass over the same prompts pays the compilation."""
    device = next(model.parameters()).device
    config = transformers.GenerationConfig(
        do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens, use_cache=True, pad_token_id=pad_token_id,
        cache_implementation="static" if static else None,
    )
    model.eval()

    def generate_all() -> int:
        tokens = 0
        for turn in prompts:
            input_ids, attention_mask = left_pad(turn, pad_token_id, device)
            out = model.generate(input_ids=input_ids, attention_mask=attention_mask.long(), generation_config=config)
            tokens += (out.shape[1] - input_ids.shape[1]) * out.shape[0]
        return tokens

    with torch.no_grad(), plain_layers(model):
        if static:
            generate_all()
        with clock.phase(name):
            tokens = generate_all()
    seconds = clock.seconds[-1][name]
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds}


@torch.no_grad()
def prepare_split(module: AgentRLModule, trajectories, clock: Clock) -> dict[str, float]:
    """`prepare_batch`'s model passes one by one on the same batch: old log-probs (with entropy), a
    reference-style pass (log-probs only; unused at kl_coef=0) and the critic's values."""
    batch = collate(trajectories, module.pad_token_id)
    batch = {k: v.to(module.device) for k, v in batch.items()}
    size, temperature, compiled = module.cfg.optim.micro_batch_size, module.cfg.rollout.temperature, module.cfg.model.compile
    module.policy.eval()
    passes = {
        "old_logprobs": lambda m: token_logprobs(module.policy, m["input_ids"], m["attention_mask"], temperature=temperature, with_entropy=True, score_mask=m["loss_mask"], compile_head=compiled),
        "ref_logprobs": lambda m: token_logprobs(module.policy, m["input_ids"], m["attention_mask"], temperature=temperature, score_mask=m["loss_mask"], compile_head=compiled),
    }
    if module.critic is not None:
        passes["values"] = lambda m: module.critic(m["input_ids"], m["attention_mask"])
    for name, run in passes.items():
        with clock.phase(name):
            for micro in micro_batches(batch, size):
                run(micro)
    module.policy.train()
    return {name: clock.seconds[-1][name] for name in passes}


def plain_hf_update(module: AgentRLModule, minibatches, clock: Clock) -> float:
    """The same mini-batches, micro-batches, AdamW steps and gradient clipping, with the actor loss
    replaced by transformers' built-in `labels=` cross-entropy on the response tokens and the critic
    trained by a masked MSE to the returns. The first mini-batch is a warm-up (optimizer state)."""
    o = module.cfg.optim
    models = [m for m in (module.policy, module.critic) if m is not None]
    rates = [o.actor_lr, o.critic_lr]
    optimizers = [torch.optim.AdamW(m.parameters(), lr=lr, betas=tuple(o.betas)) for m, lr in zip(models, rates)]

    def step(minibatch) -> None:
        minibatch = {k: v.to(module.device) for k, v in minibatch.items()}
        for model, optimizer in zip(models, optimizers):
            model.train()
            for micro in micro_batches(minibatch, o.micro_batch_size):
                mask = micro["loss_mask"].bool()
                if model is module.policy:
                    loss = model(input_ids=micro["input_ids"], attention_mask=micro["attention_mask"], labels=micro["input_ids"].masked_fill(~mask, -100)).loss
                else:
                    values = model(micro["input_ids"], micro["attention_mask"])
                    loss = ((values - micro["returns"]) ** 2 * mask).sum() / mask.sum().clamp(min=1)
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip or math.inf)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    with plain_layers(*models):
        step(minibatches[0])
        with clock.phase("plain_update"):
            for minibatch in minibatches:
                step(minibatch)
    return clock.seconds[-1]["plain_update"]


def profile_micro_batch(module: AgentRLModule, minibatch, device: torch.device, rows: int = 10) -> str:
    """Operator table (top `rows` by device time) of one micro-batch of the actor's update work:
    `token_logprobs` with entropy, forward and backward, then the critic's forward and backward."""
    micro = next(micro_batches({k: v.to(device) for k, v in minibatch.items()}, module.cfg.optim.micro_batch_size))
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
    module.policy.train()
    with torch.profiler.profile(activities=activities) as prof:
        lp = token_logprobs(module.policy, micro["input_ids"], micro["attention_mask"], with_entropy=True, score_mask=micro["loss_mask"], compile_head=module.cfg.model.compile)
        (lp.logprobs.sum() + lp.entropy.sum()).backward()
        if module.critic is not None:
            module.critic(micro["input_ids"], micro["attention_mask"]).sum().backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    module.policy.zero_grad(set_to_none=True)
    if module.critic is not None:
        module.critic.zero_grad(set_to_none=True)
    sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    return prof.key_averages().table(sort_by=sort, row_limit=rows, max_name_column_width=60)


def progress(message: str) -> None:
    print(f"[bench {time.perf_counter() - STARTED:7.1f}s] {message}", flush=True)


def run(args, save) -> dict:
    """The pipeline, then the baselines; `save(results)` is called after every stage (partial results survive a timeout)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    base = load_config(str(CONFIG))
    with tempfile.TemporaryDirectory(prefix="bench-step-") as folder:
        model_config = write_random_model(Path(folder), args.smoke, device)
        overrides = [
            "model.name=hf", f"model.path={folder}", "algo=ppo", "filter.strategy=none",
            f"diagnostics.every_n_steps={0 if args.no_diagnostics else DIAGNOSTICS_EVERY}", f"trainer.iterations={args.iterations}",
            f"trainer.accelerator={'gpu' if device.type == 'cuda' else 'cpu'}",
        ] + (SMOKE_OVERRIDES if args.smoke else ["model.dtype=bfloat16"]) + args.set
        cfg = load_config(str(CONFIG), overrides)
        if cfg.trainer.threads:
            torch.set_num_threads(cfg.trainer.threads)
        L.seed_everything(cfg.trainer.seed, verbose=False)
        module = AgentRLModule(cfg)
        data = RolloutDataModule(cfg)
    progress(f"model written and loaded ({cfg.model.path} removed); fit of {args.iterations} iterations")
    clock = Clock(device)
    probe = PipelineProbe(clock, module, data)
    trainer = L.Trainer(
        max_epochs=cfg.trainer.iterations, accelerator=cfg.trainer.accelerator, devices=1, precision=cfg.trainer.precision,
        logger=False, callbacks=[probe], reload_dataloaders_every_n_epochs=1, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0, limit_val_batches=0,
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
    mean = {k: sum(per_iteration[i][k] for i in steady) / len(steady) for k in ("generation", "prepare", "update", "other")}
    diag_iterations = [] if args.no_diagnostics else [i for i in steady if i % DIAGNOSTICS_EVERY == 0]
    diagnostics_s = sum(per_iteration[i]["diagnostics"] for i in diag_iterations) / len(diag_iterations) if diag_iterations else float("nan")
    every = base.diagnostics.every_n_steps
    amortised = diagnostics_s / every if every else 0.0
    step_s = mean["generation"] + mean["prepare"] + mean["update"] + mean["other"] + (0.0 if args.no_diagnostics else amortised)

    trajectories = probe.trajectories
    sampled = sum(sum(t.loss_mask) for t in trajectories)
    tokens = sum(len(t.token_ids) for t in trajectories)
    reasoning_tokens = probe.reasoning_tokens
    policy_params = sum(p.numel() for p in module.policy.parameters())
    critic_params = sum(p.numel() for p in module.critic.parameters()) if module.critic is not None else None
    # per steady iteration: its own mini-batches' FLOPs over its own update time (the mean, not one iteration)
    counts = [update_flops(model_config, probe.update_masks[i], policy_params, critic_params) for i in steady]
    flops, naive_flops = (sum(c[k] for c in counts) / len(steady) for k in (0, 1))
    trained = sum(int(mb["attention_mask"].sum()) for i in steady for mb in probe.update_masks[i]) / len(steady)
    last = per_iteration[-1]  # the iteration whose rollouts and mini-batches were kept (generation tokens/s, baselines)
    peak_flops = PEAK_FLOPS if device.type == "cuda" else float("nan")
    r = cfg.rollout
    results = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({platform.processor() or platform.machine()})",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "lightning": L.__version__, "cuda": torch.version.cuda},
        "config": {
            "smoke": args.smoke, "iterations": args.iterations, "policy_params": policy_params, "critic_params": critic_params,
            "hidden_size": model_config.hidden_size, "layers": model_config.num_hidden_layers, "vocab_size": model_config.vocab_size,
            "dtype": str(next(module.policy.parameters()).dtype).removeprefix("torch."), "attention": module.policy.config._attn_implementation,
            "groups": r.groups, "group_size": r.group_size, "max_turns": r.max_turns, "max_new_tokens": r.max_new_tokens,
            "algo": cfg.algo.name, "advantage": cfg.algo.advantage, "num_minibatches": cfg.optim.num_minibatches,
            "micro_batch_size": cfg.optim.micro_batch_size, "diagnostics_every_n_steps": every, "diagnostics_num_samples": cfg.diagnostics.num_samples,
        },
        "workload": {
            "rollouts": len(trajectories), "turns": sum(len(t.turns) for t in trajectories), "sampled_tokens": sampled,
            "sequence_tokens": tokens, "mean_sequence_tokens": tokens / len(trajectories),
            "max_sequence_tokens": max(len(t.token_ids) for t in trajectories),
            "diagnostics_reasoning_tokens_mean": sum(reasoning_tokens) / max(len(reasoning_tokens), 1),
        },
        "per_iteration": per_iteration,
        "step": {
            "generation_s": mean["generation"], "prepare_s": mean["prepare"], "diagnostics_iteration_s": diagnostics_s,
            "diagnostics_amortised_s": amortised, "update_s": mean["update"], "other_s": mean["other"], "step_s": step_s,
            "diagnostics_share": amortised / step_s,
        },
        "throughput": {
            "generation_tokens_per_s": sampled / last["generation"],
            "training_tokens_per_s": trained / mean["update"], "last_update_s": last["update"],
            "update_flops": flops, "update_mfu": flops / mean["update"] / peak_flops,
            "update_mfu_naive_count": naive_flops / mean["update"] / peak_flops,
        },
        "peak_memory_gib": {k: v / 2**30 for k, v in clock.peak_bytes.items()},
        "alloc_retries": dict(clock.alloc_retries),
        "baselines": {},
        "profile": None,
    }
    save(results)
    progress("pipeline done: " + json.dumps({k: round(v, 3) for k, v in results["step"].items()}))

    if args.pipeline_only:
        return results
    results["step"].update({f"{k}_s": v for k, v in prepare_split(module, trajectories, clock).items()})
    save(results)
    progress("prepare split done")
    b = results["baselines"]
    prompts = turn_prompts(trajectories)
    params = rollout_params(module, seed=0)
    b["engine"] = engine_generation(data.engine, prompts, params, clock, "engine")
    b["engine"]["cache"] = data.engine.cache_kind(device)
    save(results)
    progress(f"engine (cache={data.engine.cache}) alone: {b['engine']}")
    for kind in args.engines:
        engine = HFEngine(data.engine.model, pad_token_id=module.pad_token_id, max_batch_size=r.max_batch_size, cache=kind)
        b[f"engine_{kind}"] = engine_generation(engine, prompts, params, clock, f"engine_{kind}")
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
        b["plain_update_oom"] = f"out of memory at micro-batch {cfg.optim.micro_batch_size}"
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
        b["hf_generate_static"] = hf_generate(module.policy, prompts, module.pad_token_id, r.max_new_tokens, clock, "hf_generate_static", static=True)
        save(results)
        progress(f"transformers generate, static cache, compiled: {b['hf_generate_static']}")
    results["peak_memory_gib"] = {k: v / 2**30 for k, v in clock.peak_bytes.items()}
    results["alloc_retries"] = dict(clock.alloc_retries)
    save(results)
    return results


def format_table(res: dict) -> str:
    c, w, s, t, b = res["config"], res["workload"], res["step"], res["throughput"], res["baselines"]
    step = s["step_s"]

    def row(name, seconds, detail=""):
        return f"| {name} | {seconds:.3f} | {seconds / step:.1%} | {detail} |"

    mem = res["peak_memory_gib"]
    lines = [
        f"ragen_lit step benchmark: {res['device']}, {res['date']}",
        "versions: " + ", ".join(f"{k} {v}" for k, v in res["versions"].items()),
        f"model: Qwen2 {c['policy_params'] / 1e6:.1f}M params (critic {(c['critic_params'] or 0) / 1e6:.1f}M), d={c['hidden_size']}, "
        f"L={c['layers']}, V={c['vocab_size']}, {c['dtype']}, attention={c['attention']}, random init{' (SMOKE)' if c['smoke'] else ''}",
        f"workload: FrozenLake {c['groups']} groups x {c['group_size']} rollouts, {c['max_turns']} turns x {c['max_new_tokens']} new tokens; "
        f"{c['algo']} ({c['advantage']}), filter none, {c['num_minibatches']} mini-batches, micro-batch {c['micro_batch_size']}; "
        f"{w['turns']} turns, {w['sampled_tokens']} sampled tokens, sequences {w['mean_sequence_tokens']:.0f} tokens on average (max {w['max_sequence_tokens']})",
        f"iterations: {c['iterations']} (0 = warm-up); diagnostics every {c['diagnostics_every_n_steps']} (config), "
        f"{c['diagnostics_num_samples']} samples/scope, " + (f"synthetic reasoning {w['diagnostics_reasoning_tokens_mean']:.0f} tokens on average"
                                                              if not math.isnan(s["diagnostics_iteration_s"]) else "not measured (--no-diagnostics)"),
        "",
        "| phase | seconds | share of step | detail |",
        "| --- | ---: | ---: | --- |",
        row("generation (rollout loop)", s["generation_s"], f"{t['generation_tokens_per_s']:.0f} sampled tokens/s; peak {mem.get('generation', 0):.1f} GiB"),
        row("prepare_batch (total)", s["prepare_s"], f"peak {mem.get('prepare', 0):.1f} GiB"),
        row("- old log-probs (+entropy)", s.get("old_logprobs_s", float("nan")), "re-measured, same calls"),
        row("- ref log-probs", 0.0, f"kl_coef=0: no reference; if enabled {s.get('ref_logprobs_s', float('nan')):.3f} s"),
        row("- values (critic)", s.get("values_s", float("nan")), "re-measured, same calls"),
        row(f"diagnostics (amortised, every {c['diagnostics_every_n_steps']})", s["diagnostics_amortised_s"],
            f"one diagnostics iteration {s['diagnostics_iteration_s']:.3f} s; peak {mem.get('diagnostics', 0):.1f} GiB"),
        row("update (actor + critic)", s["update_s"], f"MFU {t['update_mfu']:.1%} ({t['update_flops'] / 1e12:.1f} TFLOP per iteration; iterations 1+); "
            f"{t['training_tokens_per_s']:.0f} training tokens/s; peak {mem.get('update', 0):.1f} GiB"),
        row("other (filter, collate, Lightning)", s["other_s"]),
        row("step (default schedule)", step, f"diagnostics share {s['diagnostics_share']:.1%}"),
        "",
        "| same work, other code | ragen_lit | baseline | speed ratio ragen_lit/baseline |",
        "| --- | ---: | ---: | ---: |",
    ]
    engines = [(k, v) for k, v in b.items() if k.startswith("engine")]
    for hf_key, hf_label in (("hf_generate", "DynamicCache"), ("hf_generate_static", "static cache, compiled")):
        for key, run in engines:
            if hf_key in b:
                label = f"engine alone (cache={run.get('cache', key.removeprefix('engine_'))}) vs transformers generate ({hf_label})"
                lines.append(f"| generation tokens/s on the same prompts: {label} | "
                             f"{run['tokens_per_s']:.0f} | {b[hf_key]['tokens_per_s']:.0f} | {run['tokens_per_s'] / b[hf_key]['tokens_per_s']:.2f} |")
    if "plain_update_oom" in b:
        lines.append(f"| update seconds, same mini-batches: PPO update vs plain HF labels= update | {t['last_update_s']:.3f} | {b['plain_update_oom']} | |")
    if "plain_update_s" in b:
        lines += [
            f"| update seconds, same mini-batches: PPO update vs plain HF labels= update | {t['last_update_s']:.3f} | {b['plain_update_s']:.3f} | "
            f"{b['plain_update_s'] / t['last_update_s']:.2f} |",
            f"| update MFU (same FLOP count) | {t['update_mfu']:.1%} | {b['plain_update_mfu']:.1%} | |",
        ]
    lines += [
        "",
        f"peak GPU memory (allocated, GiB) per phase: " + ", ".join(f"{k} {v:.1f}" for k, v in mem.items()) if mem else "peak GPU memory: n/a (CPU)",
    ]
    if res.get("alloc_retries"):
        lines.append("allocator retries (cache freed and synchronised) per phase: "
                     + ", ".join(f"{k} {v}" for k, v in res["alloc_retries"].items()))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model and batch: checks that the script runs")
    parser.add_argument("--iterations", type=int, default=3, help="RL iterations (>= 3: warm-up, steady, diagnostics; >= 2 with --no-diagnostics)")
    parser.add_argument("--no-diagnostics", action="store_true", help="skip the diagnostics measurement (step without them)")
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    parser.add_argument("--engines", nargs="*", default=[], choices=["dynamic", "static", "graph"],
                        help="also time the engine with these cache kinds on the same prompts")
    parser.add_argument("--hf-static", action="store_true",
                        help="also time transformers generate with its static cache, compiled (a first pass compiles)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="config overrides on top of the bench's own (e.g. model.compile=true optim.micro_batch_size=16)")
    parser.add_argument("--profile", action="store_true", help="also print an operator profile of one micro-batch of update work")
    parser.add_argument("--pipeline-only", action="store_true",
                        help="stop after the fit: no prepare split, engine, transformers or plain-update baselines")
    args = parser.parse_args()
    if args.iterations < (2 if args.no_diagnostics else 3):
        raise ValueError(f"--iterations must be >= 3 (warm-up, a steady step, a diagnostics step; >= 2 with --no-diagnostics), got {args.iterations}")
    def save(results: dict) -> None:
        if args.out:
            args.out.write_text(json.dumps(results, indent=2))

    results = run(args, save)
    print(format_table(results))
    if results["profile"]:
        print("\none micro-batch of update work (token_logprobs + entropy fwd/bwd, critic fwd/bwd):\n" + results["profile"])


if __name__ == "__main__":
    main()
