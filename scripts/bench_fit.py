"""Where the time of a whole default `fit` goes: generation, diagnostics, prepare, update, validation, start-up.

python scripts/bench_fit.py                          # conf/frozenlake.yaml as a user runs it
python scripts/bench_fit.py --config conf/sokoban.yaml trainer.iterations=10
python scripts/bench_fit.py --smoke                  # 2 small iterations: checks that the script runs
"""

if __name__ == "__main__":
    from bench.fit import main

    raise SystemExit(main())
