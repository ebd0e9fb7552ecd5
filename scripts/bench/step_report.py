"""The printed report of `scripts/bench_step.py`: the run, the step's phases, the same work done by
other code, and memory, from the result dict `bench.step.run` saves."""

from __future__ import annotations

import math

from bench.roofline import Roofline, format_achieved, format_roofline


def _remeasured(split: dict, key: str) -> str:
    """How a prepare sub-row was measured: re-run after the fit on the last iteration's rollouts, or not at all
    (`--pipeline-only` skips the measurements after the fit)."""
    return "re-measured, same calls" if key in split else "not re-measured (--pipeline-only)"


def engine_label(key: str, timing: dict) -> str:
    """How the table names a baseline engine: the vLLM engine, or the transformers engine with its cache kind."""
    cache = timing.get("cache", key.removeprefix("engine_"))
    return "vLLM engine alone" if cache == "vllm" else f"engine alone (cache={cache})"


def format_table(res: dict) -> str:
    """The printed report: run description, the step's phases, the same work done by other code, memory."""
    c, w, s, t, b = res["config"], res["workload"], res["step"], res["throughput"], res["baselines"]
    step = s["step_s"]

    def row(name, seconds, detail=""):
        return f"| {name} | {seconds:.3f} | {seconds / step:.1%} | {detail} |"

    mem = res["peak_memory_gib"]
    reasoning = "not measured (--no-diagnostics)"
    if not math.isnan(s["diagnostics_iteration_s"]):
        reasoning = f"synthetic reasoning {w['diagnostics_reasoning_tokens_mean']:.0f} tokens on average"
    lines = [
        f"ragen_lit step benchmark: {res['device']}, {res['date']}",
        "versions: " + ", ".join(f"{k} {v}" for k, v in res["versions"].items()),
        f"model: Qwen2 ({c['model']}) {c['policy_params'] / 1e6:.1f}M params "
        f"(critic {(c['critic_params'] or 0) / 1e6:.1f}M; trainable {c['policy_trainable_params'] / 1e6:.1f}M and "
        f"{(c['critic_trainable_params'] or 0) / 1e6:.1f}M), "
        f"d={c['hidden_size']}, L={c['layers']}, V={c['vocab_size']}, {c['dtype']}, attention={c['attention']}, "
        f"random init{' (SMOKE)' if c['smoke'] else ''}",
        f"workload: FrozenLake {c['groups']} groups x {c['group_size']} rollouts on the {c.get('engine', 'hf')} "
        f"engine, {c['max_turns']} turns x {c['max_new_tokens']} new tokens; {c['algo']} ({c['advantage']}), "
        f"filter none, {c['num_minibatches']} mini-batches, micro-batch {c['micro_batch_size']}; {w['turns']} turns, "
        f"{w['sampled_tokens']} sampled tokens, "
        f"sequences {w['mean_sequence_tokens']:.0f} tokens on average (max {w['max_sequence_tokens']})",
        f"iterations: {c['iterations']} (0 = warm-up); "
        f"diagnostics every {c['diagnostics_every_n_iterations']} (config), "
        f"{c['diagnostics_num_samples']} samples/scope, " + reasoning,
        "",
        "| phase | seconds | share of step | detail |",
        "| --- | ---: | ---: | --- |",
        row(
            "generation (rollout loop)",
            s["generation_s"],
            f"{t['generation_tokens_per_s']:.0f} sampled tokens/s; peak {mem.get('generation', 0):.1f} GiB",
        ),
        row("prepare_batch (total)", s["prepare_s"], f"peak {mem.get('prepare', 0):.1f} GiB"),
        row(
            "- old log-probs (+entropy)",
            0.0 if c.get("old_logprobs_in_update") else s.get("old_logprobs_s", float("nan")),
            "none: the update's own (one optimizer step)"
            if c.get("old_logprobs_in_update")
            else _remeasured(s, "old_logprobs_s"),
        ),
        row(
            "- ref log-probs", 0.0, f"kl_coef=0: no reference; if enabled {s.get('ref_logprobs_s', float('nan')):.3f} s"
        ),
        row(
            "- values (critic)",
            s.get("values_s", float("nan")),
            _remeasured(s, "values_s") if c.get("critic_params") else "no critic",
        ),
        row(
            f"diagnostics (amortised, every {c['diagnostics_every_n_iterations']})",
            s["diagnostics_amortised_s"],
            f"one diagnostics iteration {s['diagnostics_iteration_s']:.3f} s"
            + (f", scoring {s['diagnostics_scoring_s']:.3f} s" if "diagnostics_scoring_s" in s else "")
            + f"; peak {mem.get('diagnostics', 0):.1f} GiB",
        ),
        row(
            "update (actor + critic)",
            s["update_s"],
            f"MFU {t['update_mfu']:.1%} ({t['update_flops'] / 1e12:.1f} TFLOP per iteration; iterations 1+); "
            f"{t['training_tokens_per_s']:.0f} training tokens/s; peak {mem.get('update', 0):.1f} GiB",
        ),
        row("other (filter, collate, Lightning)", s["other_s"]),
        row("step (default schedule)", step, f"diagnostics share {s['diagnostics_share']:.1%}"),
        "",
        "| same work, other code | ragen_lit | baseline | speed ratio ragen_lit/baseline |",
        "| --- | ---: | ---: | ---: |",
    ]
    engines = [(k, v) for k, v in b.items() if k.startswith("engine")]
    for hf_key, hf_label in (("hf_generate", "DynamicCache"), ("hf_generate_static", "static cache, compiled")):
        for key, timing in engines:
            if hf_key in b:
                label = f"{engine_label(key, timing)} vs transformers generate ({hf_label})"
                ours, theirs = timing["tokens_per_s"], b[hf_key]["tokens_per_s"]
                lines.append(
                    f"| generation tokens/s on the same prompts: {label} | "
                    f"{ours:.0f} | {theirs:.0f} | {ours / theirs:.2f} |"
                )
    update_row = "| update seconds, same mini-batches: PPO update vs plain HF labels= update"
    if "plain_update_oom" in b:
        lines.append(f"{update_row} | {t['last_update_s']:.3f} | {b['plain_update_oom']} | |")
    if "plain_update_s" in b:
        lines += [
            f"{update_row} | {t['last_update_s']:.3f} | {b['plain_update_s']:.3f} | "
            f"{b['plain_update_s'] / t['last_update_s']:.2f} |",
            f"| update MFU (same FLOP count) | {t['update_mfu']:.1%} | {b['plain_update_mfu']:.1%} | |",
        ]
    trl = b.get("trl")
    if trl and "skipped" in trl:
        lines.append(f"| step seconds: ragen_lit vs TRL GRPOTrainer | {step:.3f} | {trl['skipped']} | |")
    elif trl:
        lines += [
            f"| step seconds, same prompts, model, shape: ragen_lit vs TRL {trl['version']} GRPOTrainer | "
            f"{step:.3f} | {trl['step_s']:.3f} | {trl['step_s'] / step:.2f} |",
            "",
            f"ragen_lit step = {step / trl['step_s']:.2f}x TRL's step",
        ]
    roof = Roofline(**res["roofline"])
    lines += ["", format_roofline(roof), "- rollout loop: " + format_achieved(roof, t["generation_tokens_per_s"])]
    for key, timing in engines:
        lines.append(f"- {engine_label(key, timing)}: " + format_achieved(roof, timing["tokens_per_s"]))
    memory = "peak GPU memory: n/a (CPU)"
    if mem:
        memory = "peak GPU memory (allocated, GiB) per phase: " + ", ".join(f"{k} {v:.1f}" for k, v in mem.items())
    lines += ["", memory]
    if res.get("alloc_retries"):
        lines.append(
            "allocator retries (cache freed and synchronised) per phase: "
            + ", ".join(f"{k} {v}" for k, v in res["alloc_retries"].items())
        )
    return "\n".join(lines)
