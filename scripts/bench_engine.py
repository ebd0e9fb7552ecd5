"""Throughput of the transformers rollout engine (`HFEngine`) on CPU, with and without prompt dedup.

    python scripts/bench_engine.py                 # well under a minute on 2 idle cores
    python scripts/bench_engine.py --threads 1     # on a busy machine: 2 threads then thrash

The workload is described in `ragen_lit.bench.engine`.
"""

if __name__ == "__main__":
    from ragen_lit.bench.engine import main

    raise SystemExit(main())
