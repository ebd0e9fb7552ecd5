"""The cross-scorer alone: what one collapse-diagnostics scope costs, and where its time goes.

    python scripts/bench_scoring.py --model tiny --prompts 8 --reasonings 8 --prompt-min 50 --prompt-max 200  # CPU
    python scripts/bench_scoring.py --tokens-per-forward 65536 0 --profile          # GPU: the trajectory scope's shape

The workload is described in `bench.scoring`.
"""

if __name__ == "__main__":
    from bench.scoring import main

    raise SystemExit(main())
