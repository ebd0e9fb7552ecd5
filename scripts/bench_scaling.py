"""Scaling: the multi-turn step on 1, 2, 4 GPUs under DDP and FSDP, weak scaling (the batch grows with the GPUs).

    python scripts/bench_scaling.py --smoke --devices 1 2 --strategies ddp   # tiny model on CPU ranks: checks it runs
    python scripts/bench_scaling.py --out scaling.json                        # 0.5B, 1/2/4 GPUs, DDP and FSDP

The workload and the table are described in `bench.scaling`.
"""

if __name__ == "__main__":
    from bench.scaling import main

    raise SystemExit(main())
