"""Write the bundled synthetic MathQA set: simple arithmetic word problems with integer or short
decimal answers, in MetaMathQA's question/answer shape (one JSON object per line).

The output is a pure function of --seed and --count, so re-running it reproduces the file byte for
byte. 1000 problems make the 512 validation seeds (123..634) distinct questions. Entry point:
`scripts/make_mathqa_data.py`; the environment reading the set is `ragen_lit.envs.math_qa`.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path

from ragen_lit.envs.math_qa import default_data_path

NAMES = [
    "Ava",
    "Ben",
    "Chen",
    "Dana",
    "Eli",
    "Fatima",
    "Gus",
    "Hana",
    "Ivan",
    "Jade",
    "Kofi",
    "Lena",
    "Mateo",
    "Nia",
    "Omar",
    "Priya",
]
ITEMS = ["apples", "stickers", "marbles", "books", "pencils", "cookies", "stamps", "shells", "cards", "balloons"]

Problem = tuple[str, float]


def add(rng: random.Random) -> Problem:
    name, item, a, b = rng.choice(NAMES), rng.choice(ITEMS), rng.randint(2, 60), rng.randint(2, 60)
    return f"{name} has {a} {item} and buys {b} more. How many {item} does {name} have now?", a + b


def subtract(rng: random.Random) -> Problem:
    name, friend = rng.sample(NAMES, 2)
    item, b = rng.choice(ITEMS), rng.randint(2, 40)
    a = b + rng.randint(1, 60)
    return f"{name} had {a} {item} and gave {b} of them to {friend}. How many {item} does {name} have left?", a - b


def multiply(rng: random.Random) -> Problem:
    item, a, b = rng.choice(ITEMS), rng.randint(2, 24), rng.randint(2, 12)
    return f"A box holds {a} {item}. How many {item} are in {b} boxes?", a * b


def share(rng: random.Random) -> Problem:
    item, each, children = rng.choice(ITEMS), rng.randint(2, 15), rng.randint(2, 9)
    return (
        f"{each * children} {item} are shared equally among {children} children. How many {item} does each child get?"
    ), each


def cost(rng: random.Random) -> Problem:
    price, count = rng.randint(3, 45), rng.randint(2, 9)
    return f"A notebook costs ${price}. How many dollars do {count} notebooks cost?", price * count


def reading(rng: random.Random) -> Problem:
    name, pages, days, extra = rng.choice(NAMES), rng.randint(5, 30), rng.randint(2, 7), rng.randint(1, 20)
    return (
        f"{name} reads {pages} pages a day for {days} days and then {extra} more pages. "
        f"How many pages does {name} read in total?"
    ), pages * days + extra


def distance(rng: random.Random) -> Problem:
    speed, hours = rng.choice(range(40, 130, 5)), rng.randint(2, 9)
    return (
        f"A train travels at {speed} km per hour. How many kilometers does it travel in {hours} hours?"
    ), speed * hours


def savings(rng: random.Random) -> Problem:
    name, weekly, weeks = rng.choice(NAMES), rng.randint(10, 60), rng.randint(3, 10)
    spent = rng.randint(1, weekly * weeks - 1)
    return (
        f"{name} saves ${weekly} every week. After {weeks} weeks {name} spends ${spent} on a gift. "
        f"How many dollars does {name} have left?"
    ), weekly * weeks - spent


def legs(rng: random.Random) -> Problem:
    cows, chickens = rng.randint(1, 30), rng.randint(1, 40)
    return (
        f"A farm has {cows} cows and {chickens} chickens. How many legs do these animals have in total?"
    ), 4 * cows + 2 * chickens


def area(rng: random.Random) -> Problem:
    length, width = rng.randint(3, 40), rng.randint(2, 25)
    return (
        f"A rectangle is {length} cm long and {width} cm wide. What is its area in square centimeters?"
    ), length * width


def discount(rng: random.Random) -> Problem:
    percent = rng.choice([10, 20, 25, 50])
    price = rng.randint(2, 80) * 4
    return (f"A jacket costs ${price}. It is on sale for {percent}% off. What is the sale price in dollars?"), price * (
        100 - percent
    ) / 100


def half(rng: random.Random) -> Problem:
    name, liters = rng.choice(NAMES), rng.randint(3, 41) | 1
    return (
        f"{name} pours {liters} liters of water equally into 2 buckets. How many liters are in each bucket?"
    ), liters / 2


def times_as_many(rng: random.Random) -> Problem:
    name, friend = rng.sample(NAMES, 2)
    item, a, k = rng.choice(ITEMS), rng.randint(2, 30), rng.randint(2, 5)
    return f"{name} has {a} {item}. {friend} has {k} times as many. How many {item} do they have together?", a + k * a


def population(rng: random.Random) -> Problem:
    residents, newcomers = rng.randint(1000, 90000), rng.randint(100, 9000)
    return (
        f"A town has {residents} residents and {newcomers} more move in. How many residents does the town have now?"
    ), residents + newcomers


def expression(rng: random.Random) -> Problem:
    a, b, c = rng.randint(1, 50), rng.randint(2, 12), rng.randint(2, 12)
    return f"What is {a} plus {b} times {c}?", a + b * c


TEMPLATES: list[Callable[[random.Random], Problem]] = [
    add,
    subtract,
    multiply,
    share,
    cost,
    reading,
    distance,
    savings,
    legs,
    area,
    discount,
    half,
    times_as_many,
    population,
    expression,
]


def format_answer(value: float) -> str:
    """`12` for whole numbers, `12.5` otherwise (no thousands separators)."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def make_problems(count: int, seed: int) -> list[dict[str, str]]:
    """`count` distinct problems; template and numbers drawn from `random.Random(seed)`."""
    rng = random.Random(seed)
    problems, seen = [], set()
    while len(problems) < count:
        question, value = rng.choice(TEMPLATES)(rng)
        if question not in seen:
            seen.add(question)
            problems.append({"question": question, "answer": format_answer(value)})
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000, help="number of problems (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    default_out = default_data_path()
    parser.add_argument("--out", type=Path, default=default_out, help=f"output JSONL (default {default_out})")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error(f"--count={args.count} must be >= 1")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(problem, ensure_ascii=False) for problem in make_problems(args.count, args.seed)]
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {len(lines)} problems to {args.out}")
    return 0
