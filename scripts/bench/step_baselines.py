"""The step benchmark's measurements after the fit, on the last iteration's rollouts and mini-batches: the
split of `prepare_batch`, the engine alone, transformers' own `generate`, a plain HF update and an
operator profile of one micro-batch (`bench.step` runs them and prints the comparison)."""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
import transformers

from bench.common import Clock
from ragen_lit.agent.prompts import ANSWER_CLOSE
from ragen_lit.engines.base import SamplingParams
from ragen_lit.engines.hf import HFEngine
from ragen_lit.engines.prefill import left_pad
from ragen_lit.logprobs import token_logprobs
from ragen_lit.training.batch import (
    collate,
    micro_batch_rows,
    micro_batches,  # the update's own slicing, rows and all
)
from ragen_lit.training.module import AgentRLModule


def rollout_params(module: AgentRLModule, seed: int) -> SamplingParams:
    """The sampling parameters the rollout loop uses for training turns."""
    r, tokenizer = module.cfg.rollout, module.tokenizer
    stop_ids = [
        i
        for i in {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
        if isinstance(i, int) and i >= 0
    ]
    return SamplingParams(
        max_new_tokens=r.max_new_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        stop_sequences=[module.chat.encode(ANSWER_CLOSE)],
        stop_token_ids=stop_ids,
        seed=seed,
    )


def turn_prompts(trajectories) -> list[list[list[int]]]:
    """Per turn, the prompts the engine was given (the context up to that turn's `<think>`)."""
    most = max(len(t.turns) for t in trajectories)
    return [[t.token_ids[: t.turns[k].prompt_end] for t in trajectories if len(t.turns) > k] for k in range(most)]


def engine_generation(engine: HFEngine, prompts, params: SamplingParams, clock: Clock, name: str) -> dict:
    """Seconds, sampled tokens and tokens/s of `engine` on every turn's prompts (turn k sampled with seed k)."""
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
    bound = [
        (m, m.__dict__.pop("forward"))
        for model in models
        if model is not None
        for m in model.modules()
        if "forward" in m.__dict__
    ]
    try:
        yield
    finally:
        for module, forward in bound:
            module.forward = forward


def hf_generate(
    model, prompts, pad_token_id: int, max_new_tokens: int, clock: Clock, name: str, static: bool = False
) -> dict:
    """transformers' own `generate` (sampling, T=1), exactly max_new_tokens per row: DynamicCache, or
    with `static` its StaticCache, whose forward transformers compiles itself (mode "reduce-overhead":
    CUDA graphs) on a GPU; a first untimed pass over the same prompts pays the compilation."""
    device = next(model.parameters()).device
    config = transformers.GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        use_cache=True,
        pad_token_id=pad_token_id,
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
    """`prepare_batch`'s model passes one by one on the same batch: old log-probs (with entropy; not when the
    update computes them, `old_logprobs_in_update`), a reference-style pass (log-probs only; unused at kl_coef=0)
    and the critic's values."""
    batch = collate(trajectories, module.pad_token_id)
    batch = {k: v.to(module.device) for k, v in batch.items()}
    cfg = module.cfg
    size = micro_batch_rows(cfg.optim.micro_batch_size, module.device)
    temperature, compiled = cfg.rollout.temperature, module.compiled
    module.policy.eval()
    passes = {
        "old_logprobs": lambda m: token_logprobs(
            module.policy,
            m["input_ids"],
            m["attention_mask"],
            temperature=temperature,
            with_entropy=True,
            score_mask=m["loss_mask"],
            compile_head=compiled,
        ),
        "ref_logprobs": lambda m: token_logprobs(
            module.policy,
            m["input_ids"],
            m["attention_mask"],
            temperature=temperature,
            score_mask=m["loss_mask"],
            compile_head=compiled,
        ),
    }
    if module.old_logprobs_in_update:
        del passes["old_logprobs"]
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
                    labels = micro["input_ids"].masked_fill(~mask, -100)
                    loss = model(
                        input_ids=micro["input_ids"], attention_mask=micro["attention_mask"], labels=labels
                    ).loss
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
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    module.policy.train()
    with torch.profiler.profile(activities=activities) as prof:
        lp = token_logprobs(
            module.policy,
            micro["input_ids"],
            micro["attention_mask"],
            with_entropy=True,
            score_mask=micro["loss_mask"],
            compile_head=module.compiled,
        )
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
