"""Throughput of the transformers rollout engine (`HFEngine`), with and without the shared group prefill, and
its decode roofline.

    python scripts/bench_engine.py                 # well under a minute on 2 idle cores
    python scripts/bench_engine.py --threads 1     # on a busy machine: 2 threads then thrash
    python scripts/bench_engine.py --model qwen2.5-0.5b --batches 128 --prompt-tokens 600 --max-new-tokens 100  # GPU

The workload is described in `bench.engine`.
"""

if __name__ == "__main__":
    from bench.engine import main

    raise SystemExit(main())
