"""The update alone: PPO actor + critic optimizer steps on a synthetic batch of `bench_step.py`'s shape,
for several settings side by side, each in a fresh process, with a kernel-level breakdown.

    python scripts/bench_update.py --smoke                                    # tiny model: checks the script runs
    python scripts/bench_update.py --model qwen2.5-3b --variant full: --variant lora16:model.lora.r=16  # 3B: full, LoRA
    python scripts/bench_update.py --variant eager: --variant compiled:model.compile=true,optim.micro_batch_size=16
    python scripts/bench_update.py --variant flash:model.compile=true,sdpa=flash --profile
    python scripts/bench_update.py --set model.compile=true optim.micro_batch_size=16 --variant padded: \
        --variant packed:optim.padding_free=true,model.attention=flex_attention      # padding-free vs padded

The batch, the variants and the profile are described in `bench.update`.
"""

if __name__ == "__main__":
    from bench.update import main

    raise SystemExit(main())
