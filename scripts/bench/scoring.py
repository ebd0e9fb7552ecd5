"""The cross-scorer alone: what one collapse-diagnostics scope costs (`ragen_lit.metrics.cross_scoring`).

`bench_step.py` shows that the diagnostics iteration is mostly its trajectory scope (4.2 of 5.0 s in
docs/PERFORMANCE.md's profiles); this benchmark isolates that scope's `cross_score` call so that its settings and code
can be compared in seconds. The workload imitates it: N prompts (`--prompts`, 64) whose lengths are spread evenly
between `--prompt-min` and `--prompt-max` tokens (a drawn turn's whole context, turn 1 to turn 5 of the multi-turn
bench), R reasonings (`--reasonings`, 64) of `--reasoning-tokens` ± 20%, random ids, scored R × N times on a
random-init Qwen2 of `--model`'s shape (bf16 on a GPU). Each `--tokens-per-forward` value (0: the auto bound that
diagnostics use) with each of `--modes` (the model eager, or compiled as diagnostics run it under
`model.compile=true`: `models.compile_layers` and the compiled vocabulary head) is timed as the median of `--repeats`
calls after a warm-up call; the report gives seconds, (reasoning, prompt) pairs per second, the model FLOPs of the
call (`scoring_flops`) and their MFU, and the peak memory. `--profile` runs one more call of the last setting under
the profiler (`bench.profiling`: kernels by family, device busy fraction). Each timed call repeats the warm-up's
shapes, a best case: a run's diagnostics meet new prompt lengths at every iteration, and `--fresh-shapes` gives every
call its own draw of them, so that what is cached per shape (cuDNN attention plans) is paid as in a run; `--pad-widths
on off` weighs cross_score's rounding of widths (which makes shapes repeat) against none. Entry point:
`scripts/bench_scoring.py`."""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import statistics
import time
from pathlib import Path

import torch

from bench.common import PEAK_FLOPS, device_name
from bench.engine import random_model
from bench.machine import utc_now
from bench.profiling import format_breakdown, profile_region
from bench.random_model import QWEN_SHAPES
from ragen_lit.choices import SCORER_ATTENTION
from ragen_lit.config import DiagnosticsConfig
from ragen_lit.metrics.collapse import tokens_per_forward
from ragen_lit.metrics.cross_scoring import cross_score
from ragen_lit.models import compile_layers


def workload(args, vocab_size: int, draw: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """Random prompts and reasonings (± 20% around `--reasoning-tokens`). Draw 0: prompt lengths evenly spread over
    [prompt_min, prompt_max]; draw k > 0 (`--fresh-shapes`): lengths drawn uniformly in that range, new ones per
    draw, as every diagnostics iteration of a run meets new lengths."""
    generator = torch.Generator().manual_seed(draw)
    if draw:
        drawn = torch.randint(args.prompt_min, args.prompt_max + 1, (args.prompts,), generator=generator)
        prompt_lengths = drawn.tolist()
    else:
        step = (args.prompt_max - args.prompt_min) / max(args.prompts - 1, 1)
        prompt_lengths = [round(args.prompt_min + i * step) for i in range(args.prompts)]
    spread = torch.rand(args.reasonings, generator=generator)
    reasoning_lengths = [max(1, round(args.reasoning_tokens * (0.8 + 0.4 * float(u)))) for u in spread]

    def ids(length: int) -> list[int]:
        return torch.randint(3, vocab_size, (length,), generator=generator).tolist()

    return [ids(n) for n in prompt_lengths], [ids(n) for n in reasoning_lengths]


def scoring_flops(config, prompts: list[list[int]], reasonings: list[list[int]]) -> float:
    """Model FLOPs of scoring every reasoning under every prompt with the prompt's prefix encoded once:
    per prefix of p = |x| - 1 tokens `2·N·p + 2·L·d·p²`, per (reasoning, prompt) row of w = |z| + 1 tokens
    `2·N·w + 2·V·d·w + 4·L·d·w·p + 2·L·d·w²`, where N counts the decoder's matmul weights (no embedding,
    no head), d the width, L the layers, V the vocabulary (the head runs on every row position)."""
    d, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    kv = config.num_key_value_heads * (d // config.num_attention_heads)
    per_layer = d * d + 2 * d * kv + d * d + 3 * d * config.intermediate_size  # q, k+v, o, gate+up+down
    body = layers * per_layer
    total = 0.0
    for prompt in prompts:
        p = len(prompt) - 1
        total += 2 * body * p + 2 * layers * d * p * p
        for reasoning in reasonings:
            w = len(reasoning) + 1
            total += 2 * body * w + 2 * vocab * d * w + 4 * layers * d * w * p + 2 * layers * d * w * w
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["tiny", *QWEN_SHAPES], default="qwen2.5-0.5b")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--reasonings", type=int, default=64)
    parser.add_argument("--prompt-min", type=int, default=350)
    parser.add_argument("--prompt-max", type=int, default=1700)
    parser.add_argument("--reasoning-tokens", type=int, default=100)
    parser.add_argument(
        "--tokens-per-forward", type=int, nargs="+", default=[0], help="cross_score's bound per forward (0: auto)"
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=["eager", "compiled"],
        default=["eager"],
        help="the model eager, or as diagnostics run it under model.compile=true (compiled norms, MLPs and head)",
    )
    parser.add_argument(
        "--pad-widths",
        nargs="+",
        choices=["on", "off"],
        default=["on"],
        help="cross_score's pad_widths (forward widths rounded up so that shapes repeat; on is a GPU run's default)",
    )
    parser.add_argument(
        "--attention",
        nargs="+",
        choices=list(SCORER_ATTENTION),
        default=[DiagnosticsConfig.attention],
        help="cross_score's attention (diagnostics.attention; default: its default)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--fresh-shapes",
        action="store_true",
        help="every call scores a new draw of prompt lengths (as each diagnostics iteration does): shape-keyed "
        "caches (cuDNN attention plans) cannot serve a timed call from the warm-up",
    )
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None, help="default: bf16 on a GPU")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--profile", action="store_true", help="kernel breakdown of one more call (last setting)")
    parser.add_argument("--top", type=int, default=15, help="kernels listed by --profile")
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    if args.prompts < 2 or args.reasonings < 1 or not 2 <= args.prompt_min <= args.prompt_max:
        parser.error("needs --prompts >= 2, --reasonings >= 1 and 2 <= --prompt-min <= --prompt-max")

    device = torch.device(args.device)
    dtype = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    model = random_model(args.model, getattr(torch, dtype), device)
    prompts, reasonings = workload(args, model.config.vocab_size)
    flops = scoring_flops(model.config, prompts, reasonings)
    # --fresh-shapes: the warm-up and each timed call get their own draw (new lengths, so new forward shapes)
    settings = list(itertools.product(args.tokens_per_forward, args.modes, args.pad_widths, args.attention))
    draws = iter(range(1, 1 + (1 + args.repeats) * len(settings)))

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    models = {"eager": model}
    if "compiled" in args.modes:
        models["compiled"] = copy.deepcopy(model)
        compile_layers(models["compiled"])
    results = []
    for bound, mode, pad, attention in settings:
        resolved = tokens_per_forward(model, bound)

        def call(resolved=resolved, mode=mode, pad=pad, attention=attention, work=(prompts, reasonings)):
            return cross_score(
                models[mode],
                *work,
                max_tokens_per_forward=resolved,
                compile_head=mode == "compiled",
                pad_widths=pad == "on",
                attention=attention,
            )

        def fresh() -> tuple:
            return workload(args, model.config.vocab_size, next(draws)) if args.fresh_shapes else (prompts, reasonings)

        call(work=fresh())  # warm-up
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        times, work_flops = [], []
        for _ in range(args.repeats):
            work = fresh()
            work_flops.append(scoring_flops(model.config, *work))
            sync()
            start = time.perf_counter()
            call(work=work)
            sync()
            times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
        results.append(
            {
                "tokens_per_forward": resolved,
                "mode": mode,
                "pad_widths": pad if attention != "varlen" else "n/a",  # packed rows have no widths to round
                "attention": attention,
                "seconds": seconds,
                "times_s": times,
                "pairs_per_s": len(prompts) * len(reasonings) / seconds,
                "mfu": sum(work_flops) / sum(times) / PEAK_FLOPS if device.type == "cuda" else float("nan"),
                "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan"),
            }
        )
    profile = profile_region(call, device, args.top) if args.profile else None

    mean_prompt = sum(map(len, prompts)) / len(prompts)
    mean_reasoning = sum(map(len, reasonings)) / len(reasonings)
    lines = [
        f"scoring benchmark: {device_name(device)}, {utc_now()}, torch {torch.__version__}; {args.model} random "
        f"init, {dtype}",
        f"workload: {len(reasonings)} reasonings ({mean_reasoning:.0f} tokens on average) x {len(prompts)} prompts "
        f"({args.prompt_min}-{args.prompt_max} tokens, {mean_prompt:.0f} on average); {flops / 1e12:.1f} TFLOP per "
        f"call; median of {args.repeats} calls after a warm-up"
        + ("; every call a fresh draw of prompt lengths" if args.fresh_shapes else ""),
        "",
        "| tokens per forward | model | padded widths | attention | seconds | pairs/s | MFU | peak GiB |",
        "| ---: | --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r['tokens_per_forward']} | {r['mode']} | {r['pad_widths']} | {r['attention']} | {r['seconds']:.3f} "
        f"| {r['pairs_per_s']:,.0f} | {r['mfu']:.1%} | {r['peak_gib']:.1f} |"
        for r in results
    ]
    if profile:
        last = results[-1]
        label = (
            f"one call at {last['tokens_per_forward']} tokens per forward, {last['mode']} model, padded widths "
            f"{last['pad_widths']}, attention {last['attention']}"
        )
        lines += ["", *format_breakdown(label, profile)]
    print("\n".join(lines))
    if args.out:
        meta = {"device": device_name(device), "date": utc_now(), "model": args.model, "dtype": dtype}
        workload_info = {"prompt_tokens_mean": mean_prompt, "reasoning_tokens_mean": mean_reasoning, "flops": flops}
        args.out.write_text(
            json.dumps({**meta, "workload": workload_info, "results": results, "profile": profile}, indent=1)
        )
    return 0
