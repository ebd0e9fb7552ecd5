"""Cost of the template-collapse diagnostics: share of iteration time and scorer memory.

    python scripts/bench_diagnostics.py [--iterations 5] [--model-path DIR] [key=value ...]
    python scripts/bench_diagnostics.py --smoke --model-path DIR      # tiny sizes: checks the script runs

Both measurements and their targets are described in `bench.diagnostics`.
"""

if __name__ == "__main__":
    from bench.diagnostics import main

    raise SystemExit(main())
