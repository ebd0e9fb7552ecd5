"""The update alone: actor (and critic) optimizer steps on a synthetic batch of `bench_step.py`'s shape,
for several settings side by side, each in a fresh process, with a kernel-level breakdown.

`bench_step.py` times the whole iteration; this benchmark isolates its update (its MFU)
so that settings can be compared in minutes. The batch imitates bench_step's workload:
`--rows` episodes (128) of `--turns` (5) turns, each turn a prompt part followed by `--response` (100)
sampled tokens, sequence lengths uniform in `--length` ± `--length-spread` (1,700 ± 5%: what the
device's tokenizer gave; a wider spread imitates transcripts of different lengths, where padding costs
more), random token ids; `prepare_batch` adds old log-probs, values and GAE advantages as in a run.
The model is `bench_step.py`'s random-init Qwen2 (`--model`, written once and loaded by every variant). One
pass over the iteration's mini-batches (`optim.num_minibatches`) is the warm-up (compilation,
optimizer state); the median of `--repeats` timed passes is reported, with the MFU counted as in
`bench_step.py` (`bench.common.update_flops`: under LoRA the frozen weights need no weight
gradient; the "naive 6N" column counts every weight as trained).

A variant is `name:key=value,...`: config keys (`optim.micro_batch_size=16`), plus `sdpa=<backend>` (flash | cudnn
| efficient | math: restricts `scaled_dot_product_attention` to that kernel for the whole update). Padded against
padding-free micro-batches: a variant with `optim.padding_free=true` (on a GPU with
`model.attention=flex_attention`) beside one without; the MFU counts real tokens only, so the two compare directly.
`--fresh-shapes` gives every pass its own batch (new lengths, so new micro-batch widths, as every iteration of a
run has), where by default every pass replays one batch and shape-keyed caches (cuDNN attention's plans) serve all
passes after the warm-up. `--profile` records one mini-batch per variant with the CUDA profiler and prints the
device time by kernel family (matmul, attention, triton-fused element-wise, other element-wise, optimizer), the
device's busy fraction of the wall time, and the top kernels.
Entry point: `scripts/bench_update.py`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from bench.common import CONFIG, PEAK_FLOPS, SCRIPTS, SMOKE_OVERRIDES, device_name, module_weights, update_flops
from bench.machine import utc_now
from bench.profiling import format_breakdown, profile_region
from bench.random_model import DEFAULT_SHAPE, QWEN_SHAPES, SMOKE, write_random_model
from ragen_lit.config import load_config
from ragen_lit.training.batch import micro_batch_rows, select_rows
from ragen_lit.training.data import plan_minibatches
from ragen_lit.training.module import AgentRLModule, attach_fabric
from ragen_lit.training.sections import ModuleSections

SDPA_BACKENDS = ("flash", "cudnn", "efficient", "math")


def parse_variant(text: str) -> tuple[str, list[str], str | None]:
    """`name:key=value,...` → (name, config overrides, sdpa backend or None)."""
    name, colon, rest = text.partition(":")
    if not name or not colon:
        raise SystemExit(f"--variant {text!r}: expected name:key=value,... (the name may not be empty)")
    overrides, sdpa = [], None
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise SystemExit(f"--variant {text!r}: {item!r} is not key=value")
        if key == "sdpa":
            if value not in SDPA_BACKENDS:
                raise SystemExit(f"--variant {text!r}: sdpa={value!r}; allowed: {', '.join(SDPA_BACKENDS)}")
            sdpa = value
        else:
            overrides.append(item)
    return name, overrides, sdpa


def synthetic_batch(
    rows: int, length: int, turns: int, response: int, vocab: int, seed: int, spread: float = 0.05
) -> dict[str, torch.Tensor]:
    """Right-padded episodes: each of `turns` turns is a prompt part then `response` sampled tokens
    (loss_mask), lengths uniform in length × (1 ± spread); the reward sits on the last sampled token."""
    g = torch.Generator().manual_seed(seed)
    shortest = max(int(length * (1 - spread)), 2 * turns)  # every turn keeps a prompt token and a sampled one
    lengths = torch.randint(shortest, int(length * (1 + spread)) + 1, (rows,), generator=g)
    width = int(lengths.max())
    batch = {
        "input_ids": torch.randint(0, vocab, (rows, width), generator=g),
        "attention_mask": torch.zeros(rows, width, dtype=torch.bool),
        "loss_mask": torch.zeros(rows, width, dtype=torch.bool),
        "sample_logprobs": torch.zeros(rows, width),
        "token_rewards": torch.zeros(rows, width),
        "turn_end_mask": torch.zeros(rows, width, dtype=torch.bool),
        "scores": torch.rand(rows, generator=g),
        "group_ids": torch.arange(rows) // 8,
    }
    for b, n in enumerate(lengths.tolist()):
        batch["attention_mask"][b, :n] = True
        turn = n // turns
        for t in range(turns):
            end = (t + 1) * turn
            batch["loss_mask"][b, max(end - response, t * turn + 1) : end] = True
            batch["turn_end_mask"][b, end - 1] = True
        batch["token_rewards"][b, turns * turn - 1] = batch["scores"][b]
    return batch


def run_variant(args) -> dict:
    """One variant in this process: load, prepare, warm up, time, optionally profile."""
    name, overrides, sdpa = parse_variant(args.run_variant)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = load_config(
        str(CONFIG),
        [
            "model.name=hf",
            f"model.path={args.model_folder}",
            "algo=ppo",
            "filter.strategy=none",
            f"trainer.accelerator={'gpu' if device.type == 'cuda' else 'cpu'}",
        ]
        + (SMOKE_OVERRIDES if args.smoke else ["model.dtype=bfloat16"])
        + args.set
        + overrides,
    )
    if cfg.trainer.threads:
        torch.set_num_threads(cfg.trainer.threads)
    torch.manual_seed(cfg.trainer.seed)
    module = attach_fabric(AgentRLModule(ModuleSections.of(cfg)).to(device))  # `update` without a Trainer
    module.configure_model()
    config = module.policy.config
    vocab = min(config.vocab_size, 32768)
    attention = nullcontext()
    if sdpa:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = {
            "flash": SDPBackend.FLASH_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "math": SDPBackend.MATH,
        }[sdpa]
        attention = sdpa_kernel([backend])

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def prepared_minibatches(seed: int) -> list[dict[str, torch.Tensor]]:
        batch = synthetic_batch(
            args.rows, args.length, args.turns, args.response, vocab, seed=seed, spread=args.length_spread
        )
        module.prepare_batch(batch, keep_ratio=1.0)
        plan = plan_minibatches(
            args.rows, args.rows, cfg.optim.num_minibatches, "scale", 1, torch.Generator().manual_seed(0)
        )
        return [select_rows(batch, rows) for rows in plan]

    with attention:
        # --fresh-shapes: every pass its own batch (new lengths, so new micro-batch widths), as every iteration of
        # a run has; else every pass replays the first batch
        first = prepared_minibatches(0)
        passes = [first] + [prepared_minibatches(k) if args.fresh_shapes else first for k in range(1, 1 + args.repeats)]
        optimizers, schedulers = module.configure_optimizers()

        def one_pass(batches) -> float:
            sync()
            start = time.perf_counter()
            for mb in batches:
                module.update(mb, optimizers, schedulers)
            sync()
            module.pop_step_stats()
            return time.perf_counter() - start

        warmup_s = one_pass(passes[0])
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        times = [one_pass(minibatches) for minibatches in passes[1:]]
        profile = None
        if args.profile:
            extra = prepared_minibatches(1 + args.repeats) if args.fresh_shapes else passes[0]
            profile = profile_region(lambda: one_pass(extra[:1]), device, args.top)
    update_s = statistics.median(times)
    policy, critic = module_weights(module)
    # per timed pass on average (with --fresh-shapes each pass is its own batch), against the median pass time
    counts = [update_flops(config, minibatches, policy, critic) for minibatches in passes[1:]]
    flops, naive = (statistics.mean(c[i] for c in counts) for i in (0, 1))
    pass_tokens = [sum(int(mb["attention_mask"].sum()) for mb in minibatches) for minibatches in passes[1:]]
    tokens = statistics.mean(pass_tokens)
    peak = PEAK_FLOPS if device.type == "cuda" else float("nan")
    return {
        "variant": name,
        "overrides": overrides,
        "sdpa": sdpa or "default",
        "micro_batch_size": micro_batch_rows(cfg.optim.micro_batch_size, device),
        "compile": module.compiled,
        "trainable_params": policy.trainable + (critic.trainable if critic else 0),
        "critic": critic is not None,
        "warmup_s": warmup_s,
        "update_s": update_s,
        "times_s": times,
        "mfu": flops / update_s / peak,
        "mfu_naive_count": naive / update_s / peak,
        "tokens_per_s": tokens / update_s,
        "tokens_per_pass": pass_tokens,
        "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan"),
        "profile": profile,
    }


def format_report(meta: dict, results: list[dict]) -> str:
    lines = [
        f"update benchmark: {meta['device']}, {meta['date']}, torch {meta['torch']}; {meta['model']} random init",
        f"batch: {meta['rows']} episodes x {meta['length']} ± {meta['length_spread']:.0%} tokens "
        f"({meta['turns']} turns, {meta['response']} sampled tokens each); {meta['algo']}: actor"
        f"{' + critic' if any(r.get('critic') for r in results) else ''}, "
        f"{meta['num_minibatches']} mini-batches; median of {meta['repeats']} passes after one warm-up pass"
        + ("; every pass its own batch (--fresh-shapes)" if meta["fresh_shapes"] else ""),
        "",
        "| variant | settings | micro-batch | update s | MFU | MFU (naive 6N count) | tokens/s | peak GiB "
        "| warm-up s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['variant']} | failed: {r['error']} | | | | | | | |")
            continue
        settings = ", ".join(r["overrides"] + ([f"sdpa={r['sdpa']}"] if r["sdpa"] != "default" else [])) or "(config)"
        lines.append(
            f"| {r['variant']} | {settings} | {r['micro_batch_size']} | {r['update_s']:.3f} | {r['mfu']:.1%} "
            f"| {r['mfu_naive_count']:.1%} | {r['tokens_per_s']:,.0f} | {r['peak_gib']:.1f} | {r['warmup_s']:.1f} |"
        )
    for r in results:
        if r.get("profile"):
            lines += ["", *format_breakdown(f"{r['variant']}: one mini-batch", r["profile"])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE,...",
        help="a setting to time (repeatable; default: one variant with the config as is)",
    )
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides for every variant")
    parser.add_argument("--rows", type=int, default=128, help="episodes in the iteration's batch")
    parser.add_argument("--length", type=int, default=1700, help="mean sequence length (tokens)")
    parser.add_argument("--length-spread", type=float, default=0.05, help="lengths uniform in length x (1 +- this)")
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--response", type=int, default=100, help="sampled tokens per turn")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes over the mini-batches")
    parser.add_argument("--profile", action="store_true", help="kernel breakdown of one mini-batch per variant")
    parser.add_argument(
        "--fresh-shapes",
        action="store_true",
        help="every pass trains on its own batch (new lengths): shape-keyed caches (cuDNN attention plans) are paid "
        "as in a run, whose every iteration has new lengths",
    )
    parser.add_argument("--top", type=int, default=15, help="kernels listed per profile")
    parser.add_argument(
        "--model",
        choices=list(QWEN_SHAPES),
        default=DEFAULT_SHAPE,
        help="the random-init model's architecture (--smoke overrides it with a tiny shape)",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny model and batch (CPU is fine)")
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    parser.add_argument("--run-variant", help=argparse.SUPPRESS)  # internal: run one variant in this process
    parser.add_argument("--model-folder", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.length_spread < 0:
        raise SystemExit(f"--length-spread={args.length_spread}: must be >= 0 (a fraction of --length)")
    if args.smoke:
        args.model = SMOKE
        args.rows, args.length, args.turns, args.response = min(args.rows, 8), min(args.length, 64), 2, 8
    for text in args.variant:
        parse_variant(text)  # bad variants stop here, before any model is built
    if args.run_variant:
        args.result.write_text(json.dumps(run_variant(args)))
        return 0

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    variants = args.variant or ["config:"]
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-update-") as folder:
        write_random_model(Path(folder), args.model, device)
        for text in variants:
            result_file = Path(folder) / "result.json"
            command = [
                sys.executable,
                str(SCRIPTS / "bench_update.py"),
                "--run-variant",
                text,
                "--model-folder",
                folder,
                "--result",
                str(result_file),
                "--rows",
                str(args.rows),
                "--length",
                str(args.length),
                "--length-spread",
                str(args.length_spread),
                "--turns",
                str(args.turns),
                "--response",
                str(args.response),
                "--repeats",
                str(args.repeats),
                "--top",
                str(args.top),
                "--set",
                *args.set,
            ]
            command += ["--smoke"] * args.smoke + ["--profile"] * args.profile + ["--fresh-shapes"] * args.fresh_shapes
            started = time.perf_counter()
            done = subprocess.run(command, stderr=subprocess.PIPE, text=True)
            if done.returncode == 0:
                results.append(json.loads(result_file.read_text()))
            else:
                last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                results.append({"variant": text.partition(":")[0], "error": last[:200]})
                print(done.stderr[-3000:], file=sys.stderr)
            print(f"[bench_update] {text}: {time.perf_counter() - started:.0f} s", flush=True)
    cfg = load_config(str(CONFIG), (SMOKE_OVERRIDES if args.smoke else []) + args.set)
    meta = {
        "device": device_name(device),
        "date": utc_now(),
        "torch": torch.__version__,
        "model": args.model,
        "rows": args.rows,
        "length": args.length,
        "length_spread": args.length_spread,
        "turns": args.turns,
        "response": args.response,
        "repeats": args.repeats,
        "num_minibatches": cfg.optim.num_minibatches,
        "algo": cfg.algo.name,
        "fresh_shapes": args.fresh_shapes,
    }
    if args.out:
        args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    print(format_report(meta, results))
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":  # each variant's own process (see `main`)
    raise SystemExit(main())
