"""Write the bundled synthetic MathQA set (`src/ragen_lit/envs/data/mathqa_synthetic.jsonl`): arithmetic
word problems in MetaMathQA's question/answer shape, a pure function of --seed and --count.

    python scripts/make_mathqa_data.py                      # 1000 problems, seed 0
    python scripts/make_mathqa_data.py --count 200 --out /tmp/small.jsonl

The generator is `ragen_lit.envs.mathqa_synthetic`.
"""

if __name__ == "__main__":
    from ragen_lit.envs.mathqa_synthetic import main

    raise SystemExit(main())
