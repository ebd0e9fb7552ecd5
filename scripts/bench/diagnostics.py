"""Cost of the template-collapse diagnostics: share of iteration time and scorer memory.

1. Share of iteration time: `conf/frozenlake.yaml` (with the `key=value` overrides) is trained in this
   process with `ragen_lit.cli.fit`, validation off and everything written to a temporary folder; the
   per-iteration `time/diagnostics_s` and `time/iteration_s` are read back from the run's MLflow
   history. Amortised share = Σ diagnostics seconds / Σ iteration seconds over the run; with the default
   schedule (`diagnostics.every_n_iterations=5`, and at the first iteration) 5 iterations hold one
   diagnostics iteration. Target: ≤ 10%.
2. Peak memory of `cross_score` versus a naive scorer (the same forwards of at most
   `max_tokens_per_forward` padded tokens, but full-vocabulary fp32 logits for the whole forward, a
   log-softmax over all of them, then a gather) on a random fp32 Qwen2 with a 32,768-token vocabulary,
   R=64 reasonings of ~60 tokens and N=8 prompts of ~150 tokens. Each scorer runs in a fresh
   subprocess and its cost is the growth of the peak resident set size (`ru_maxrss`) across the call:
   torch's CPU allocations are invisible to `tracemalloc`. Target: the naive peak ≥ 3× the scorer's,
   with the same `L_sum`.
Entry point: `scripts/bench_diagnostics.py`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from bench.common import CONFIG, SCRIPTS
from bench.machine import utc_now

SHARE_TARGET = 0.10
MEMORY_RATIO_TARGET = 3.0
SMOKE_OVERRIDES = [
    "rollout.groups=2",
    "rollout.group_size=4",
    "rollout.max_turns=2",
    "rollout.max_new_tokens=16",
    "optim.num_minibatches=2",
    "optim.micro_batch_size=4",
    "diagnostics.num_samples=4",
    "trainer.threads=1",
]


@dataclass(frozen=True)
class MemoryCase:
    """Sizes of the scorer-memory case: a random Qwen2 and random token ids."""

    vocab_size: int = 32768
    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 256
    num_reasonings: int = 64
    reasoning_tokens: int = 60
    num_prompts: int = 8
    prompt_tokens: int = 150
    max_tokens_per_forward: int = 8192


SMOKE_CASE = MemoryCase(
    vocab_size=1024,
    hidden_size=32,
    intermediate_size=64,
    num_reasonings=6,
    reasoning_tokens=8,
    num_prompts=3,
    prompt_tokens=12,
    max_tokens_per_forward=128,
)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    system = f"{platform.system()} {platform.release()}"
    return f"{platform.node()} ({cpu}, {os.cpu_count()} CPU cores, {system}), torch {torch.__version__}"


# --- 1. share of iteration time -------------------------------------------------------------------


def time_share(overrides: list[str], iterations: int, model_path: str | None) -> dict:
    """Train the FrozenLake config for `iterations` and read the timing history back from MLflow."""
    from mlflow.tracking import MlflowClient

    from ragen_lit.cli import fit
    from ragen_lit.config import load_config

    with tempfile.TemporaryDirectory(prefix="bench_diagnostics_") as tmp:
        uri = f"sqlite:///{tmp}/mlruns.db"
        forced = [
            f"trainer.iterations={iterations}",
            "validation.num_envs=0",
            f"logging.output_dir={tmp}",
            f"logging.tracking_uri={uri}",
        ]
        if model_path:
            forced.append(f"model.path={model_path}")
        cfg = load_config(str(CONFIG), [*overrides, *forced])
        # fit's own summary goes to stderr so that stdout holds only this script's table
        with contextlib.redirect_stdout(sys.stderr):
            fit(cfg)
        client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name(cfg.logging.experiment)
        (run,) = client.search_runs([experiment.experiment_id])
        history = {
            name: {m.step: m.value for m in client.get_metric_history(run.info.run_id, name)}
            for name in ("time/diagnostics_s", "time/iteration_s", "collapse/valid_reasoning_rate")
        }
    steps = sorted(history["time/iteration_s"])
    return {
        "config": {
            "groups": cfg.rollout.groups,
            "group_size": cfg.rollout.group_size,
            "max_turns": cfg.rollout.max_turns,
            "max_new_tokens": cfg.rollout.max_new_tokens,
            "every_n_iterations": cfg.diagnostics.every_n_iterations,
            "num_samples": cfg.diagnostics.num_samples,
            "threads": cfg.trainer.threads,
            "model": cfg.model.path or cfg.model.name,
        },
        "iterations": [
            {
                "iteration": step,
                "iteration_s": history["time/iteration_s"][step],
                "diagnostics_s": history["time/diagnostics_s"].get(step, 0.0),
                "diagnostics_ran": step in history["collapse/valid_reasoning_rate"],
                "valid_reasoning_rate": history["collapse/valid_reasoning_rate"].get(step, float("nan")),
            }
            for step in steps
        ],
    }


# --- 2. scorer memory -----------------------------------------------------------------------------


def random_case(case: MemoryCase):
    """A random fp32 Qwen2 of the case's shape and random prompts/reasonings (lengths ±20%)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=case.vocab_size,
        hidden_size=case.hidden_size,
        num_hidden_layers=case.num_hidden_layers,
        num_attention_heads=case.num_attention_heads,
        num_key_value_heads=case.num_key_value_heads,
        intermediate_size=case.intermediate_size,
        max_position_embeddings=4096,
    )
    model = transformers.Qwen2ForCausalLM(config).float().eval()
    generator = torch.Generator().manual_seed(1)

    def sequences(count: int, mean_length: int) -> list[list[int]]:
        spread = max(1, mean_length // 5)
        lengths = torch.randint(mean_length - spread, mean_length + spread + 1, (count,), generator=generator)
        return [torch.randint(1, case.vocab_size, (int(n),), generator=generator).tolist() for n in lengths]

    return model, sequences(case.num_prompts, case.prompt_tokens), sequences(case.num_reasonings, case.reasoning_tokens)


@torch.no_grad()
def naive_score(model, prompts, reasonings, max_tokens_per_forward: int) -> torch.Tensor:
    """L_sum [R, N]: the same packing bound as `cross_score`, but each forward materialises its full
    [P, T, V] fp32 logits and their log-softmax before gathering the reasoning tokens."""
    pairs = [(r, j) for r in range(len(reasonings)) for j in range(len(prompts))]
    longest = max(len(prompts[j]) + len(reasonings[r]) for r, j in pairs)
    per_forward = max(1, max_tokens_per_forward // longest)
    seq_logprob = torch.zeros(len(reasonings), len(prompts), dtype=torch.float64)
    for start in range(0, len(pairs), per_forward):
        chunk = pairs[start : start + per_forward]
        input_ids = torch.zeros(len(chunk), longest, dtype=torch.long)
        attention_mask = torch.zeros(len(chunk), longest, dtype=torch.long)
        reasoning_mask = torch.zeros(len(chunk), longest, dtype=torch.bool)
        for row, (r, j) in enumerate(chunk):
            prompt_length, total = len(prompts[j]), len(prompts[j]) + len(reasonings[r])
            input_ids[row, :total] = torch.tensor([*prompts[j], *reasonings[r]])
            attention_mask[row, :total] = 1
            reasoning_mask[row, prompt_length:total] = True
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits.float()
        logprobs = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
        sums = (logprobs.double() * reasoning_mask[:, 1:]).sum(-1)
        for row, (r, j) in enumerate(chunk):
            seq_logprob[r, j] = sums[row]
    return seq_logprob


def measure_one(scorer: str, case: MemoryCase, out: Path) -> None:
    """Subprocess body: peak-RSS growth (bytes) and seconds of one scorer call; saved with its L_sum."""
    from ragen_lit.metrics.cross_scoring import cross_score

    model, prompts, reasonings = random_case(case)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    if scorer == "cross_score":
        l_sum = cross_score(model, prompts, reasonings, max_tokens_per_forward=case.max_tokens_per_forward)[1].double()
    else:
        l_sum = naive_score(model, prompts, reasonings, case.max_tokens_per_forward)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # ru_maxrss is in KiB on Linux
    torch.save({"peak_growth_bytes": (after - before) * 1024, "seconds": seconds, "l_sum": l_sum}, out)


def scorer_memory(case: MemoryCase, threads: int) -> dict:
    """Run both scorers, each in a fresh interpreter, and compare their peaks and L_sum."""
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_diagnostics_mem_") as tmp:
        for scorer in ("cross_score", "naive"):
            out = Path(tmp) / f"{scorer}.pt"
            command = [
                sys.executable,
                str(SCRIPTS / "bench_diagnostics.py"),
                "--measure",
                scorer,
                "--measure-out",
                str(out),
                "--case",
                ",".join(f"{k}={v}" for k, v in asdict(case).items()),
                "--threads",
                str(threads),
            ]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"{scorer} measurement failed:\n{done.stderr[-3000:]}")
            results[scorer] = torch.load(out)
    ours, naive = results["cross_score"], results["naive"]
    return {
        "case": asdict(case),
        "cross_score_bytes": ours["peak_growth_bytes"],
        "naive_bytes": naive["peak_growth_bytes"],
        "cross_score_s": ours["seconds"],
        "naive_s": naive["seconds"],
        "ratio": naive["peak_growth_bytes"] / max(ours["peak_growth_bytes"], 1),
        "l_sum_max_abs_diff": float((ours["l_sum"] - naive["l_sum"]).abs().max()),
        "l_sum_max_abs": float(naive["l_sum"].abs().max()),
    }


def parse_case(text: str) -> MemoryCase:
    fields = dict(item.split("=", 1) for item in text.split(","))
    return MemoryCase(**{k: int(v) for k, v in fields.items()})


# --- report ---------------------------------------------------------------------------------------


def format_table(share: dict, memory: dict, smoke: bool, overrides: list[str]) -> str:
    c, rows = share["config"], share["iterations"]
    diag_total = sum(r["diagnostics_s"] for r in rows)
    iter_total = sum(r["iteration_s"] for r in rows)
    amortised = diag_total / iter_total
    ran_seconds = ", ".join(
        f"{r['diagnostics_s']:.3f} (iteration {r['iteration']})" for r in rows if r["diagnostics_ran"]
    )
    mib = 2**20
    m, mc = memory, memory["case"]
    lines = [
        f"ragen_lit diagnostics cost benchmark{' (SMOKE)' if smoke else ''}",
        f"machine: {machine()}",
        f"date: {utc_now()}",
        "",
        f"## 1. share of iteration time: conf/frozenlake.yaml, overrides: {' '.join(overrides) or '(none)'}",
        f"model {c['model']}; {c['groups']} groups x {c['group_size']} rollouts, {c['max_turns']} turns x "
        f"{c['max_new_tokens']} new tokens; diagnostics every {c['every_n_iterations']} iterations (and the first), "
        f"{c['num_samples']} samples/scope; threads {c['threads']}",
        "",
        "| iteration | iteration s | diagnostics s | diagnostics ran | valid reasoning rate |",
        "| ---: | ---: | ---: | --- | ---: |",
        *(
            f"| {r['iteration']} | {r['iteration_s']:.3f} | {r['diagnostics_s']:.3f} | "
            f"{'yes' if r['diagnostics_ran'] else 'no'} | {r['valid_reasoning_rate']:.3f} |"
            for r in rows
        ),
        "",
        "| figure | value |",
        "| --- | ---: |",
        f"| diagnostics seconds on the iterations where they ran | {ran_seconds or 'none'} |",
        f"| total diagnostics seconds | {diag_total:.3f} |",
        f"| total iteration seconds | {iter_total:.3f} |",
        f"| amortised share of iteration time | {amortised:.2%} |",
        f"| target | <= {SHARE_TARGET:.0%}: {'met' if amortised <= SHARE_TARGET else 'NOT met'} |",
        "",
        f"## 2. scorer peak memory: random fp32 Qwen2 V={mc['vocab_size']}, d={mc['hidden_size']}, "
        f"L={mc['num_hidden_layers']}; R={mc['num_reasonings']} reasonings x ~{mc['reasoning_tokens']} tokens, "
        f"N={mc['num_prompts']} prompts x ~{mc['prompt_tokens']} tokens; "
        f"max_tokens_per_forward={mc['max_tokens_per_forward']}; peak RSS growth in a fresh process",
        "",
        "| scorer | peak RSS growth MiB | seconds |",
        "| --- | ---: | ---: |",
        f"| cross_score (chunked log-softmax) | {m['cross_score_bytes'] / mib:.1f} | {m['cross_score_s']:.2f} |",
        f"| naive (full fp32 logits + log_softmax) | {m['naive_bytes'] / mib:.1f} | {m['naive_s']:.2f} |",
        "",
        "| figure | value |",
        "| --- | ---: |",
        f"| memory ratio naive / cross_score | {m['ratio']:.2f}x |",
        f"| target | >= {MEMORY_RATIO_TARGET:.0f}x: {'met' if m['ratio'] >= MEMORY_RATIO_TARGET else 'NOT met'} |",
        f"| L_sum max abs diff (max abs L_sum {m['l_sum_max_abs']:.1f}) | {m['l_sum_max_abs_diff']:.2e} |",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="key=value overrides of conf/frozenlake.yaml")
    parser.add_argument(
        "--iterations",
        type=int,
        default=5,
        help="RL iterations (default 5: one diagnostics iteration at the default schedule)",
    )
    parser.add_argument(
        "--model-path", help="local folder of the policy model (model.path); default: the config's model"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny rollouts, 1 iteration and a tiny memory case")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the memory subprocesses")
    parser.add_argument("--measure", choices=("cross_score", "naive"), help=argparse.SUPPRESS)
    parser.add_argument("--measure-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.measure:
        measure_one(args.measure, parse_case(args.case), args.measure_out)
        return 0
    if args.iterations < 1:
        raise ValueError(f"--iterations must be >= 1, got {args.iterations}")
    for item in args.overrides:
        if "=" not in item:
            raise ValueError(f"overrides must be key=value, got {item!r}")
    overrides = [*SMOKE_OVERRIDES, *args.overrides] if args.smoke else list(args.overrides)
    iterations = 1 if args.smoke else args.iterations
    memory = scorer_memory(SMOKE_CASE if args.smoke else MemoryCase(), args.threads)
    share = time_share(overrides, iterations, args.model_path)
    print(format_table(share, memory, args.smoke, overrides))
    return 0


if __name__ == "__main__":  # each scorer's own process (see `scorer_memory`)
    raise SystemExit(main())
