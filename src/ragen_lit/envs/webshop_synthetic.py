"""Write the bundled WebShop (lite) catalog and instructions: a pure function of --seed and the counts.

Products are drawn type by type (shirts, sneakers, mugs, ...): a brand, a colour, a material, two of
the type's features (the attributes), a subset of the type's option values (sizes, capacities,
packs, ...) and a price in the type's range. Instructions are made from a target product as WebShop's
synthetic goals are: its type with some of its attributes (always the colour; the material and one
feature sometimes), one value of each of its options, and a price limit drawn like WebShop's (the
larger of two of the next four multiples of 10 above the price), for example "I need a red cotton
shirt, long sleeve, size: m, fit: slim fit, under $40". Re-running reproduces the file byte for byte.

    python scripts/make_webshop_data.py                  # 300 products, 1000 instructions, seed 0

The environment reading the file is `ragen_lit.envs.webshop`.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragen_lit.envs.webshop_catalog import default_data_path


@dataclass(frozen=True)
class ProductType:
    name: str
    category: tuple[str, str]  # department, aisle (the type is the third level)
    materials: tuple[str, ...]
    features: tuple[str, ...]
    options: dict[str, tuple[str, ...]] = field(default_factory=dict)
    price: tuple[int, int] = (10, 40)


SIZES = ("xs", "s", "m", "l", "xl")
SHOE_SIZES = ("6", "7", "8", "9", "10", "11", "12")
TYPES = (
    ProductType(
        "shirt",
        ("clothing", "tops"),
        ("cotton", "linen", "flannel", "polyester"),
        ("long sleeve", "short sleeve", "machine washable", "wrinkle free"),
        {"size": SIZES, "fit": ("slim fit", "regular fit")},
        (15, 45),
    ),
    ProductType(
        "t-shirt",
        ("clothing", "tops"),
        ("cotton", "polyester", "bamboo"),
        ("crew neck", "v neck", "machine washable", "moisture wicking"),
        {"size": SIZES, "pack": ("1 pack", "3 pack")},
        (8, 30),
    ),
    ProductType(
        "hoodie",
        ("clothing", "tops"),
        ("cotton", "fleece", "polyester"),
        ("zip up", "pullover", "machine washable", "kangaroo pocket"),
        {"size": SIZES},
        (20, 60),
    ),
    ProductType(
        "jeans",
        ("clothing", "bottoms"),
        ("denim", "stretch denim"),
        ("high waist", "button fly", "distressed", "machine washable"),
        {"size": ("28", "30", "32", "34", "36"), "fit": ("slim fit", "straight fit", "relaxed fit")},
        (25, 70),
    ),
    ProductType(
        "shorts",
        ("clothing", "bottoms"),
        ("cotton", "nylon", "linen"),
        ("elastic waist", "quick dry", "cargo pockets", "drawstring"),
        {"size": SIZES},
        (12, 35),
    ),
    ProductType(
        "sneakers",
        ("shoes", "athletic"),
        ("mesh", "leather", "canvas"),
        ("non slip", "lightweight", "memory foam", "lace up"),
        {"size": SHOE_SIZES},
        (30, 90),
    ),
    ProductType(
        "boots",
        ("shoes", "outdoor"),
        ("leather", "suede", "rubber"),
        ("waterproof", "insulated", "non slip", "steel toe"),
        {"size": SHOE_SIZES, "width": ("regular", "wide")},
        (45, 120),
    ),
    ProductType(
        "sandals",
        ("shoes", "casual"),
        ("leather", "rubber", "cork"),
        ("adjustable strap", "arch support", "quick dry", "lightweight"),
        {"size": SHOE_SIZES},
        (15, 50),
    ),
    ProductType(
        "backpack",
        ("bags", "travel"),
        ("nylon", "canvas", "polyester"),
        ("laptop sleeve", "water resistant", "usb port", "padded straps"),
        {"capacity": ("20 liters", "30 liters", "40 liters")},
        (25, 80),
    ),
    ProductType(
        "tote bag",
        ("bags", "everyday"),
        ("canvas", "leather", "jute"),
        ("zipper closure", "inner pocket", "reusable", "foldable"),
        {},
        (10, 40),
    ),
    ProductType(
        "mug",
        ("home", "kitchen"),
        ("ceramic", "glass", "stainless steel"),
        ("dishwasher safe", "microwave safe", "insulated", "with lid"),
        {"capacity": ("12 oz", "16 oz", "20 oz"), "pack": ("1 pack", "2 pack", "4 pack")},
        (8, 30),
    ),
    ProductType(
        "water bottle",
        ("home", "kitchen"),
        ("stainless steel", "glass", "plastic"),
        ("leak proof", "insulated", "bpa free", "dishwasher safe"),
        {"capacity": ("500 ml", "750 ml", "1 liter")},
        (10, 35),
    ),
    ProductType(
        "blanket",
        ("home", "bedding"),
        ("fleece", "cotton", "wool"),
        ("machine washable", "lightweight", "hypoallergenic", "reversible"),
        {"size": ("twin", "queen", "king")},
        (20, 70),
    ),
    ProductType(
        "pillow",
        ("home", "bedding"),
        ("memory foam", "down", "cotton"),
        ("hypoallergenic", "cooling", "machine washable", "firm support"),
        {"pack": ("1 pack", "2 pack")},
        (15, 50),
    ),
    ProductType(
        "towel",
        ("home", "bath"),
        ("cotton", "bamboo", "microfiber"),
        ("quick dry", "absorbent", "machine washable", "lint free"),
        {"pack": ("2 pack", "4 pack", "6 pack")},
        (10, 40),
    ),
    ProductType(
        "desk lamp",
        ("home", "lighting"),
        ("metal", "wood", "plastic"),
        ("dimmable", "usb port", "touch control", "adjustable arm"),
        {"plug": ("us plug", "eu plug")},
        (15, 55),
    ),
    ProductType(
        "hat",
        ("accessories", "headwear"),
        ("wool", "cotton", "straw"),
        ("adjustable strap", "wide brim", "packable", "sun protection"),
        {"size": ("s/m", "l/xl")},
        (10, 35),
    ),
    ProductType(
        "scarf",
        ("accessories", "winter"),
        ("wool", "cashmere", "acrylic"),
        ("lightweight", "fringe", "oversized", "soft"),
        {},
        (12, 60),
    ),
    ProductType(
        "sunglasses",
        ("accessories", "eyewear"),
        ("metal", "plastic", "acetate"),
        ("polarized", "uv protection", "lightweight", "foldable"),
        {},
        (12, 80),
    ),
    ProductType(
        "headphones",
        ("electronics", "audio"),
        ("plastic", "aluminum", "leather"),
        ("wireless", "noise cancelling", "foldable", "built in mic"),
        {"style": ("over ear", "on ear")},
        (25, 150),
    ),
    ProductType(
        "phone case",
        ("electronics", "accessories"),
        ("silicone", "leather", "plastic"),
        ("shockproof", "slim", "card holder", "kickstand"),
        {"model": ("phone 13", "phone 14", "phone 15")},
        (8, 30),
    ),
)
COLOURS = ("red", "blue", "black", "white", "green", "grey", "navy", "pink", "brown", "yellow", "beige", "purple")
BRANDS = (
    "Northwind",
    "Alder",
    "Brightline",
    "Cobalt",
    "Dunmore",
    "Evergreen",
    "Fairway",
    "Granite",
    "Harbor",
    "Juniper",
    "Kestrel",
    "Lumen",
)
OPENERS = ("I need", "I want", "Find me", "I am looking for")
PAIRS = frozenset({"jeans", "shorts", "sneakers", "boots", "sandals", "sunglasses", "headphones"})


def article(described: str, kind: str) -> str:
    """`a pair of` for the plural types, else `a` or `an`."""
    if kind in PAIRS:
        return "a pair of"
    return "an" if described[0] in "aeiou" else "a"


def make_product(number: int, kind: ProductType, rng: random.Random) -> dict[str, Any]:
    colour, material = rng.choice(COLOURS), rng.choice(kind.materials)
    features = sorted(rng.sample(kind.features, 2), key=kind.features.index)
    options = {}
    for name, values in kind.options.items():
        count = rng.randint(min(2, len(values)), len(values))
        options[name] = sorted(rng.sample(values, count), key=values.index)
    low, high = kind.price
    return {
        "id": f"P{number:04d}",
        "title": f"{rng.choice(BRANDS)} {colour} {material} {kind.name}",
        "type": kind.name,
        "category": [*kind.category, kind.name],
        "attributes": [colour, material, *features],
        "options": options,
        "price": rng.randint(low, high) - 0.01,
    }


def price_limit(price: float, rng: random.Random) -> float:
    """WebShop's synthetic price limit: the larger of two of the next four multiples of 10 above."""
    above = [10.0 * k for k in range(1, 100) if 10.0 * k > price][:4]
    return max(rng.sample(above, 2))


def make_goal(product: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    colour, material, *features = product["attributes"]
    attributes = [colour]
    if rng.random() < 0.7:
        attributes.append(material)
    feature = rng.choice(features) if rng.random() < 0.5 else None
    described = " ".join([*attributes, product["type"]])
    if feature:
        attributes.append(feature)
    options = {name: rng.choice(values) for name, values in product["options"].items()}
    upper = price_limit(product["price"], rng)
    parts = [f"{rng.choice(OPENERS)} {article(described, product['type'])} {described}"]
    if feature:
        parts.append(feature)
    parts += [f"{name}: {value}" for name, value in options.items()]
    parts.append(f"under ${upper:.0f}")
    return {
        "product": product["id"],
        "instruction": ", ".join(parts),
        "attributes": attributes,
        "options": options,
        "price_upper": upper,
    }


def make_shop(products: int, goals: int, seed: int) -> dict[str, list[dict[str, Any]]]:
    """`products` products (types in turn) and `goals` distinct instructions, all drawn from
    `random.Random(seed)`."""
    rng = random.Random(seed)
    catalog = [make_product(number, TYPES[number % len(TYPES)], rng) for number in range(products)]
    rng.shuffle(catalog)
    chosen, seen = [], set()
    while len(chosen) < goals:
        goal = make_goal(rng.choice(catalog), rng)
        if goal["instruction"] not in seen:
            seen.add(goal["instruction"])
            chosen.append(goal)
    return {"products": catalog, "goals": chosen}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--products", type=int, default=300, help="catalog size (default 300)")
    parser.add_argument("--goals", type=int, default=1000, help="number of instructions (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    default_out = default_data_path()
    parser.add_argument("--out", type=Path, default=default_out, help=f"output JSON (default {default_out})")
    args = parser.parse_args(argv)
    if args.products < 1 or args.goals < 1:
        parser.error("--products and --goals must be >= 1")
    shop = make_shop(args.products, args.goals, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # One record per line: small, and diffs of a regenerated file stay readable.
    lines = ['{"products": [']
    lines += [json.dumps(p) + ("," if i + 1 < len(shop["products"]) else "") for i, p in enumerate(shop["products"])]
    lines += ['], "goals": [']
    lines += [json.dumps(g) + ("," if i + 1 < len(shop["goals"]) else "") for i, g in enumerate(shop["goals"])]
    lines += ["]}"]
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {len(shop['products'])} products and {len(shop['goals'])} instructions to {args.out}")
    return 0
