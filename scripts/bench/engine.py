"""Throughput of the transformers rollout engine (`HFEngine`), with and without the shared prefill of a group's
prompt, against the bandwidth roofline of its own decode steps.

The workload mimics turn 1 of a training iteration: groups of 16 rollouts share one prompt, and a
set of stop tokens ends rows at different steps (as answers do); with `--suffix-tokens` a later turn (each
row continues its group's prompt with its own ids, as the turns so far do). The model is randomly initialised:
a Qwen2 of the built-in tiny model's shape by default (CPU-sized), or of a real model's shape with
`--model qwen2.5-0.5b` or `qwen2.5-3b` (for a GPU; `bench.random_model.QWEN_SHAPES`), so no weights are
loaded. Tokens/s counts sampled tokens over the
wall time of one `generate` call (prefill included); "prefill s" is the time inside the engine's
prefill (with the dedup on: the group's prompt once, copied to the group's rows after; later turns: then
each row's own suffix). On a GPU every
configuration first runs once untimed (CUDA graph capture). The roofline line is
`bench.roofline`'s for the dedup-on call of each row. `--profile` runs the last configuration once
more under the profiler and prints its kernels by family and the device's busy fraction (`bench.profiling`).
`--compile` adds each configuration on a copy of the model under `model.compile` (`models.compile_layers`: its
decode steps run compiled norms and MLPs), labelled "<cache>, compiled"; `--compile-decode` adds cache=graph with
each decode step the whole forward through `torch.compile` (`HFEngine(compile_decode=True)`), labelled "<cache>,
compiled decode"; `--split-attention` adds each cache=graph row with flash-decoding's kernels
(`HFEngine(split_attention=True)`, CUDA).
Entry point: `scripts/bench_engine.py`.
"""

from __future__ import annotations

import argparse
import copy
import os
import time

import torch
import transformers

from bench.common import device_name
from bench.machine import cpu_name, utc_now
from bench.profiling import format_breakdown, profile_region
from bench.random_model import QWEN_SHAPES
from bench.roofline import decode_workload, format_achieved, format_roofline, model_roofline
from ragen_lit.engines.base import SamplingParams
from ragen_lit.engines.hf import HFEngine
from ragen_lit.models import compile_layers

GROUP_SIZE = 16
TINY_VOCAB_SIZE = 1540


def random_model(name: str, dtype: torch.dtype, device: torch.device) -> transformers.Qwen2ForCausalLM:
    """A random-init Qwen2: the tiny model's shape ("tiny") or a shape of `QWEN_SHAPES` ("qwen2.5-0.5b", …)."""
    torch.manual_seed(0)
    if name == "tiny":
        config = transformers.Qwen2Config(
            vocab_size=TINY_VOCAB_SIZE,
            hidden_size=128,
            intermediate_size=384,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=4096,
        )
    else:
        config = transformers.Qwen2Config(**QWEN_SHAPES[name])
    with torch.device(device):
        return transformers.Qwen2ForCausalLM(config).to(dtype).eval()


def group_prompts(batch: int, prompt_tokens: int, vocab_size: int, suffix_tokens: int = 0) -> list[list[int]]:
    """`batch` prompts in groups of 16 sharing one prompt, lengths spread over ±20% of `prompt_tokens`; with
    `suffix_tokens`, each row continues it with its own random ids (±20% as many): a later turn of a group."""
    generator = torch.Generator().manual_seed(1)

    def random_ids(tokens: int) -> list[int]:
        length = int(tokens * (0.8 + 0.4 * torch.rand(1, generator=generator)))
        return torch.randint(3, vocab_size, (length,), generator=generator).tolist()

    prompts = []
    for _ in range(max(1, batch // GROUP_SIZE)):
        prompt = random_ids(prompt_tokens)
        for _ in range(min(GROUP_SIZE, batch)):
            prompts.append(prompt + (random_ids(suffix_tokens) if suffix_tokens else []))
    return prompts


def tokens_per_second(engine: HFEngine, prompts: list[list[int]], params: SamplingParams) -> float:
    start = time.perf_counter()
    generations = engine.generate(prompts, params)
    elapsed = time.perf_counter() - start
    return sum(len(g.token_ids) for g in generations) / elapsed


class Timing:
    """One timed `generate` call: wall seconds, seconds inside the prefill, sampled tokens, and the
    (prompt lengths, sampled counts) of its rows for the roofline."""

    def __init__(self, engine: HFEngine, prompts: list[list[int]], params: SamplingParams, device: torch.device):
        def sync() -> None:
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        prefill, self.prefill_s = engine._prefill, 0.0

        def timed_prefill(*args, **kwargs):
            sync()
            start = time.perf_counter()
            out = prefill(*args, **kwargs)
            sync()
            self.prefill_s += time.perf_counter() - start
            return out

        engine._prefill = timed_prefill
        try:
            sync()
            start = time.perf_counter()
            generations = engine.generate(prompts, params)
            sync()
            self.seconds = time.perf_counter() - start
        finally:
            del engine._prefill
        self.tokens = sum(len(g.token_ids) for g in generations)
        self.tokens_per_s = self.tokens / self.seconds
        self.call = ([len(p) for p in prompts], [len(g.token_ids) for g in generations])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 64, 128])
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument(
        "--suffix-tokens", type=int, default=0, help="each row's own ids after its group's prompt (a later turn)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--model", choices=["tiny", *QWEN_SHAPES], default="tiny", help="random-init Qwen2 shape")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None, help="default: bf16 on a GPU")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--caches",
        nargs="+",
        choices=["dynamic", "static", "graph"],
        help="default: graph on a GPU, else dynamic static",
    )
    parser.add_argument(
        "--split-attention",
        action="store_true",
        help="also time each cache=graph row with flash-decoding's kernels (CUDA; elsewhere they keep sdpa)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="also time each configuration on a copy of the model under model.compile (compiled norms and MLPs)",
    )
    parser.add_argument(
        "--compile-decode",
        action="store_true",
        help="also time cache=graph with each decode step the whole forward through torch.compile "
        "(the fast path's compiled step), on the --compile copy if there is one",
    )
    parser.add_argument(
        "--profile", action="store_true", help="kernel breakdown of one more call (the last row's settings, dedup on)"
    )
    parser.add_argument("--top", type=int, default=15, help="kernels listed by --profile")
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    dtype = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    caches = args.caches or (["graph"] if device.type == "cuda" else ["dynamic", "static"])
    torch.set_num_threads(args.threads)
    model = random_model(args.model, getattr(torch, dtype), device)
    vocab_size = model.config.vocab_size
    # One stop id in 40 ends a row after ~40 sampled tokens on average (random weights: near-uniform).
    params = SamplingParams(
        max_new_tokens=args.max_new_tokens, temperature=1.0, stop_token_ids=list(range(3, vocab_size, 40)), seed=0
    )
    machine = device_name(device) if device.type == "cuda" else f"{cpu_name()}, {os.cpu_count()} cores"
    print(f"engine benchmark: {machine}, {args.threads} threads, {utc_now()}; {args.model} random init, {dtype}")
    HFEngine(model, pad_token_id=0).generate(
        group_prompts(GROUP_SIZE, 16, vocab_size), SamplingParams(max_new_tokens=2)
    )

    models = {"": model}
    if args.compile:
        models[", compiled"] = copy.deepcopy(model)
        compile_layers(models[", compiled"])
    if args.compile_decode:
        models[", compiled decode"] = models.get(", compiled", model)
    header = ("batch", "cache", "prefill s dedup", "prefill s plain", "ratio", "tok/s dedup", "tok/s plain", "ratio")
    rows, rooflines = [], []
    runs = [
        (b, c, m, a)
        for b in args.batches
        for c in caches
        for m in models
        for a in ((False, True) if c == "graph" and args.split_attention else (False,))
    ]

    def make_engine(suffix: str, cache: str, split: bool, dedup: bool = True) -> HFEngine:
        return HFEngine(
            models[suffix],
            pad_token_id=0,
            cache=cache,
            dedup_prompts=dedup,
            share_prefixes=dedup,
            device=device,
            split_attention=split,
            compile_decode=suffix.endswith("compiled decode"),
        )

    for batch, cache, suffix, split in runs:
        prompts = group_prompts(batch, args.prompt_tokens, vocab_size, args.suffix_tokens)
        label = cache + suffix + (", split attention" if split else "")
        timings = []
        for dedup in (True, False):
            engine = make_engine(suffix, cache, split, dedup)
            if device.type == "cuda":
                Timing(engine, prompts, params, device)
            timings.append(Timing(engine, prompts, params, device))
        on, off = timings
        rows.append(
            (
                str(batch),
                label,
                f"{on.prefill_s:.3f}",
                f"{off.prefill_s:.3f}",
                f"{off.prefill_s / on.prefill_s:.2f}",
                f"{on.tokens_per_s:.0f}",
                f"{off.tokens_per_s:.0f}",
                f"{on.tokens_per_s / off.tokens_per_s:.2f}",
            )
        )
        roof = model_roofline(model, decode_workload([on.call]), device_name(device))
        rooflines.append(
            f"batch {batch}, cache={label}, dedup: {format_achieved(roof, on.tokens_per_s)}; " + format_roofline(roof)
        )
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print(" | ".join(cell.ljust(width) for cell, width in zip(row, widths)))
    print("\n".join(["", *rooflines]))
    if args.profile:
        engine = make_engine(suffix, cache, split)
        profile = profile_region(lambda: engine.generate(prompts, params), device, args.top)
        label = f"batch {args.batches[-1]}, cache={label}, one generate call"
        label += f" ({args.max_new_tokens} steps at most)"
        print("\n".join(["", *format_breakdown(label, profile)]))
    return 0
