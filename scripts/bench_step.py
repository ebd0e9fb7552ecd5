"""Step-time benchmark of one ragen_lit RL iteration: FrozenLake, PPO (policy + critic), bf16, one device.

    python scripts/bench_step.py --out bench.json    # Qwen2.5-0.5B architecture, random init, the defaults
    python scripts/bench_step.py --pipeline-only --set rollout.exact=true   # the engine's exact path
    python scripts/bench_step.py --model qwen2.5-3b --set model.lora.r=16   # the paper's size, LoRA adapters
    python scripts/bench_step.py --no-diagnostics --iterations 2 --profile   # the step and baselines only
    python scripts/bench_step.py --engines dynamic --hf-static   # also the dynamic cache and transformers' static cache
    python scripts/bench_step.py --smoke             # tiny model (overrides --model), small batch: CPU is fine

Generation, prepare_batch, diagnostics and the update timed inside a Lightning fit, then compared with
transformers' own code doing the same work; the workload and the FLOP count are described in
`bench.step`.
"""

if __name__ == "__main__":
    from bench.step import main

    raise SystemExit(main())
