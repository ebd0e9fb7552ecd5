"""Write the bundled synthetic coding set (`src/ragen_lit/envs/data/coding_synthetic.jsonl`): small
function-writing tasks with a reference solution, two example tests in the prompt and four hidden ones,
a pure function of --seed and --count.

    python scripts/make_coding_data.py                      # 520 problems, seed 0
    python scripts/make_coding_data.py --count 50 --out /tmp/small.jsonl

The generator is `ragen_lit.envs.coding_synthetic`.
"""

if __name__ == "__main__":
    from ragen_lit.envs.coding_synthetic import main

    raise SystemExit(main())
