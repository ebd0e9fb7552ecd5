"""Throughput of the transformers rollout engine (`HFEngine`) on CPU, with and without prompt dedup.

The workload mimics turn 1 of a training iteration: groups of 16 rollouts share one prompt, and a
set of stop tokens ends rows at different steps (as answers do). The model is a randomly initialised
Qwen2 of the built-in tiny model's shape (`ragen_lit.presets.tiny.build.TinyRecipe`), so no weights are
loaded. Tokens/s counts generated tokens over the wall time of one `generate` call (prefill included).
Entry point: `scripts/bench_engine.py`.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import torch
import transformers

from ragen_lit.bench.machine import cpu_name
from ragen_lit.engines.base import SamplingParams
from ragen_lit.engines.hf import HFEngine

GROUP_SIZE = 16
VOCAB_SIZE = 1540


def tiny_model(dtype: torch.dtype) -> transformers.Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    )
    return transformers.Qwen2ForCausalLM(config).to(dtype).eval()


def group_prompts(batch: int, prompt_tokens: int) -> list[list[int]]:
    """`batch` prompts in groups of 16 identical ones, lengths spread over ±20% of `prompt_tokens`."""
    generator = torch.Generator().manual_seed(1)
    prompts = []
    for _ in range(max(1, batch // GROUP_SIZE)):
        length = int(prompt_tokens * (0.8 + 0.4 * torch.rand(1, generator=generator)))
        prompt = torch.randint(3, VOCAB_SIZE, (length,), generator=generator).tolist()
        prompts += [prompt] * min(GROUP_SIZE, batch)
    return prompts


def tokens_per_second(engine: HFEngine, prompts: list[list[int]], params: SamplingParams) -> float:
    start = time.perf_counter()
    generations = engine.generate(prompts, params)
    elapsed = time.perf_counter() - start
    return sum(len(g.token_ids) for g in generations) / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 64, 128])
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    model = tiny_model(getattr(torch, args.dtype))
    # One stop id in 40 ends a row after ~40 sampled tokens on average (random weights: near-uniform).
    params = SamplingParams(
        max_new_tokens=args.max_new_tokens, temperature=1.0, stop_token_ids=list(range(3, VOCAB_SIZE, 40)), seed=0
    )
    machine = f"{cpu_name()}, {os.cpu_count()} cores, {args.threads} threads"
    date = datetime.datetime.now().isoformat(timespec="minutes")
    HFEngine(model, pad_token_id=0).generate(group_prompts(GROUP_SIZE, 16), SamplingParams(max_new_tokens=2))

    header = ("machine", "date", "batch", "cache", "dtype", "tok/s dedup", "tok/s no dedup")
    rows = []
    for batch in args.batches:
        prompts = group_prompts(batch, args.prompt_tokens)
        for cache in ("dynamic", "static"):
            speeds = [
                tokens_per_second(HFEngine(model, pad_token_id=0, cache=cache, dedup_prompts=dedup), prompts, params)
                for dedup in (True, False)
            ]
            rows.append((machine, date, str(batch), cache, args.dtype, *(f"{s:.0f}" for s in speeds)))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print(" | ".join(cell.ljust(width) for cell, width in zip(row, widths)))
    return 0
