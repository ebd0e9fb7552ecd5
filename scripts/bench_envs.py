"""Benchmark the environment generators and the Countdown answer checker on this machine.

    python scripts/bench_envs.py              # 500 instances per env
    python scripts/bench_envs.py --instances 2000

What each table holds is described in `bench.envs`.
"""

if __name__ == "__main__":
    from bench.envs import main

    raise SystemExit(main())
