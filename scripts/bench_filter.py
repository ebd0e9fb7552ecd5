"""Update time with and without SNR-aware filtering on the *same* rollout batch (docs/METHOD.md §4).

    python scripts/bench_filter.py [--config conf/frozenlake.yaml] [key=value ...]

Target: the filtered update within 1.25 x kept_ratio x the unfiltered one (`bench.filter`).
"""

if __name__ == "__main__":
    from bench.filter import main

    raise SystemExit(main())
