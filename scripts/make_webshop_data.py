"""Write the bundled WebShop (lite) set (`src/ragen_lit/envs/data/webshop_synthetic.json`): a generated
catalog (products with a type, category, attributes, options and a price) and instructions made from
target products, a pure function of --seed and the counts.

    python scripts/make_webshop_data.py                          # 300 products, 1000 instructions, seed 0
    python scripts/make_webshop_data.py --goals 50 --out /tmp/shop.json

The generator is `ragen_lit.envs.webshop_synthetic`.
"""

if __name__ == "__main__":
    from ragen_lit.envs.webshop_synthetic import main

    raise SystemExit(main())
