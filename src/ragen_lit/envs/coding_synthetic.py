"""Write the bundled coding set: small function-writing tasks with a reference solution, two example
tests shown in the prompt and hidden ones, one JSON object per line in `ragen_lit.envs.coding`'s own
record shape (`prompt`, `fn_name`, `tests`, `public_tests`, `solution`).

Each task family has parameters (a threshold, a character, a divisor, ...) drawn from the seed, so the
same family reads differently from problem to problem; the expected outputs come from running the
family's reference solution (our own code, in this process). The output is a pure function of --seed
and --count. Entry point: `scripts/make_coding_data.py`.
"""

from __future__ import annotations

import argparse
import json
import random
import string
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ragen_lit.envs.coding import default_data_path

PUBLIC_TESTS = 2
HIDDEN_TESTS = 4

Family = Callable[[random.Random], tuple[str, str, str, Callable[[random.Random], list[Any]]]]


def _ints(rng: random.Random, low: int = -20, high: int = 50, size: tuple[int, int] = (0, 8)) -> list[int]:
    return [rng.randint(low, high) for _ in range(rng.randint(*size))]


def _word(rng: random.Random, letters: str = string.ascii_lowercase, size: tuple[int, int] = (1, 8)) -> str:
    return "".join(rng.choice(letters) for _ in range(rng.randint(*size)))


def _sentence(rng: random.Random) -> str:
    return " ".join(_word(rng, size=(1, 6)) for _ in range(rng.randint(1, 5)))


def sum_above(rng):
    k = rng.randint(-5, 20)
    return (
        f"Write a function `sum_above(nums)` that returns the sum of the integers in the list `nums` that are "
        f"greater than {k} (0 if there are none).",
        "sum_above",
        f"def sum_above(nums):\n    return sum(x for x in nums if x > {k})\n",
        lambda r: [_ints(r)],
    )


def count_char(rng):
    c = rng.choice("aeiourst")
    return (
        f"Write a function `count_char(text)` that returns how many times the letter '{c}' occurs in the "
        "string `text`.",
        "count_char",
        f"def count_char(text):\n    return text.count({c!r})\n",
        lambda r: [_word(r, "abcdeiorstu", (0, 12))],
    )


def multiples(rng):
    d = rng.randint(2, 9)
    return (
        f"Write a function `multiples(n)` that returns the list of positive multiples of {d} that are at most "
        "`n`, in increasing order.",
        "multiples",
        f"def multiples(n):\n    return list(range({d}, n + 1, {d}))\n",
        lambda r: [r.randint(0, 60)],
    )


def reverse_words(rng):
    sep = rng.choice([" ", "-", ","])
    return (
        f"Write a function `reverse_words(text)` that splits `text` on single spaces and returns the words in "
        f"reverse order joined with {sep!r}.",
        "reverse_words",
        f"def reverse_words(text):\n    return {sep!r}.join(reversed(text.split(' ')))\n",
        lambda r: [_sentence(r)],
    )


def clamp_list(rng):
    low = rng.randint(-10, 5)
    high = low + rng.randint(1, 20)
    return (
        f"Write a function `clamp_list(nums)` that returns a new list where every integer of `nums` below {low} "
        f"becomes {low} and every integer above {high} becomes {high}.",
        "clamp_list",
        f"def clamp_list(nums):\n    return [min(max(x, {low}), {high}) for x in nums]\n",
        lambda r: [_ints(r, -30, 40)],
    )


def digit_sum(rng):
    base = rng.choice([10, 10, 2, 8])
    name = {10: "decimal", 2: "binary", 8: "octal"}[base]
    return (
        f"Write a function `digit_sum(n)` that returns the sum of the digits of the non-negative integer `n` "
        f"written in {name} (base {base}).",
        "digit_sum",
        "def digit_sum(n):\n    total = 0\n    while n:\n"
        f"        total += n % {base}\n        n //= {base}\n    return total\n",
        lambda r: [r.randint(0, 10**6)],
    )


def is_palindrome(rng):
    ignore_case = rng.random() < 0.5
    rule = "ignoring upper/lower case" if ignore_case else "exactly (case matters)"
    body = "text = text.lower()\n    " if ignore_case else ""
    return (
        f"Write a function `is_palindrome(text)` that returns True if the string `text` reads the same "
        f"backwards, comparing {rule}, and False otherwise.",
        "is_palindrome",
        f"def is_palindrome(text):\n    {body}return text == text[::-1]\n",
        lambda r: [_palindrome_or_not(r)],
    )


def _palindrome_or_not(rng: random.Random) -> str:
    half = _word(rng, "abAB", (0, 4))
    if rng.random() < 0.5:
        return half + rng.choice(["", "c"]) + half[::-1].swapcase()
    return half + rng.choice(["", "c"]) + half[::-1]


def running_total(rng):
    start = rng.randint(-5, 5)
    return (
        f"Write a function `running_total(nums)` that returns the list of running sums of `nums`, starting "
        f"from {start}: element i is {start} plus nums[0] + ... + nums[i].",
        "running_total",
        f"def running_total(nums):\n    out, total = [], {start}\n    for x in nums:\n"
        "        total += x\n        out.append(total)\n    return out\n",
        lambda r: [_ints(r, -9, 9)],
    )


def second_largest(rng):
    fallback = rng.choice([-1, 0, None])
    return (
        "Write a function `second_largest(nums)` that returns the second largest distinct integer in `nums`, "
        f"or {fallback} if there are fewer than two distinct values.",
        "second_largest",
        f"def second_largest(nums):\n    values = sorted(set(nums))\n    return values[-2] if len(values) > 1 "
        f"else {fallback}\n",
        lambda r: [_ints(r, 0, 9, (0, 6))],
    )


def dedupe(rng):
    keep = rng.choice(["first", "last"])
    order = "nums" if keep == "first" else "reversed(nums)"
    tail = "out" if keep == "first" else "out[::-1]"
    return (
        f"Write a function `dedupe(nums)` that removes repeated integers from `nums`, keeping the {keep} "
        "occurrence of each, and returns the remaining values in their original order.",
        "dedupe",
        f"def dedupe(nums):\n    seen, out = set(), []\n    for x in {order}:\n        if x not in seen:\n"
        f"            seen.add(x)\n            out.append(x)\n    return {tail}\n",
        lambda r: [_ints(r, 0, 6, (0, 9))],
    )


def caesar(rng):
    k = rng.randint(1, 25)
    return (
        f"Write a function `caesar(text)` that shifts every lower-case letter of `text` {k} places forward in "
        "the alphabet (wrapping from z to a) and leaves every other character unchanged.",
        "caesar",
        "def caesar(text):\n    return ''.join(chr((ord(c) - 97 + "
        f"{k}) % 26 + 97) if 'a' <= c <= 'z' else c for c in text)\n",
        lambda r: [_word(r, "abcxyz !", (0, 10))],
    )


def count_primes(rng):
    inclusive = rng.random() < 0.5
    bound = "at most" if inclusive else "below"
    stop = "n + 1" if inclusive else "n"
    return (
        f"Write a function `count_primes(n)` that returns how many prime numbers are {bound} `n`.",
        "count_primes",
        f"def count_primes(n):\n    return sum(all(p % d for d in range(2, int(p ** 0.5) + 1)) for p in range(2, "
        f"{stop}))\n",
        lambda r: [r.randint(0, 80)],
    )


def max_window(rng):
    k = rng.randint(2, 4)
    return (
        f"Write a function `max_window(nums)` that returns the largest sum of {k} consecutive integers of "
        f"`nums`, or None if `nums` has fewer than {k} elements.",
        "max_window",
        f"def max_window(nums):\n    if len(nums) < {k}:\n        return None\n"
        f"    return max(sum(nums[i:i + {k}]) for i in range(len(nums) - {k} + 1))\n",
        lambda r: [_ints(r, -9, 9, (0, 9))],
    )


def fizz(rng):
    a, b = rng.sample(range(2, 8), 2)
    return (
        f"Write a function `fizz(n)` that returns a list of strings for the numbers 1 to `n`: 'Fizz' for "
        f"multiples of {a}, 'Buzz' for multiples of {b}, 'FizzBuzz' for multiples of both, otherwise the "
        "number itself as a string.",
        "fizz",
        f"def fizz(n):\n    out = []\n    for i in range(1, n + 1):\n        word = ('Fizz' if i % {a} == 0 else '')"
        f" + ('Buzz' if i % {b} == 0 else '')\n        out.append(word or str(i))\n    return out\n",
        lambda r: [r.randint(0, 16)],
    )


def most_common(rng):
    tie = rng.choice(["smallest", "largest"])
    key = "(-counts[x], x)" if tie == "smallest" else "(-counts[x], -x)"
    return (
        "Write a function `most_common(nums)` that returns the integer occurring most often in the non-empty "
        f"list `nums`; on a tie, the {tie} such integer.",
        "most_common",
        f"def most_common(nums):\n    counts = {{}}\n    for x in nums:\n        counts[x] = counts.get(x, 0) + 1\n"
        f"    return min(counts, key=lambda x: {key})\n",
        lambda r: [_ints(r, 0, 5, (1, 9))],
    )


def rotate(rng):
    k = rng.randint(1, 5)
    side = rng.choice(["left", "right"])
    shift = f"{k} % len(nums)" if side == "left" else f"-({k} % len(nums))"
    return (
        f"Write a function `rotate(nums)` that returns `nums` rotated {k} places to the {side} (an empty list "
        "stays empty).",
        "rotate",
        f"def rotate(nums):\n    if not nums:\n        return []\n    k = {shift}\n    return nums[k:] + nums[:k]\n",
        lambda r: [_ints(r, 0, 9, (0, 7))],
    )


def count_words(rng):
    min_len = rng.randint(1, 4)
    return (
        f"Write a function `count_words(text)` that returns how many space-separated words of `text` have at "
        f"least {min_len} letters.",
        "count_words",
        f"def count_words(text):\n    return sum(len(w) >= {min_len} for w in text.split())\n",
        lambda r: [_sentence(r)],
    )


def merge_sorted(rng):
    descending = rng.random() < 0.5
    order = "decreasing" if descending else "increasing"
    return (
        f"Write a function `merge_sorted(a, b)` that returns all integers of the lists `a` and `b` in {order} "
        "order (duplicates kept).",
        "merge_sorted",
        f"def merge_sorted(a, b):\n    return sorted(a + b, reverse={descending})\n",
        lambda r: [sorted(_ints(r, 0, 20, (0, 5))), sorted(_ints(r, 0, 20, (0, 5)))],
    )


def bits(rng):
    value = rng.choice(["1", "0"])
    return (
        f"Write a function `bits(n)` that returns how many '{value}' digits the binary form of the positive "
        "integer `n` has (no leading zeros).",
        "bits",
        f"def bits(n):\n    return bin(n)[2:].count({value!r})\n",
        lambda r: [r.randint(1, 5000)],
    )


def gcd_list(rng):
    fallback = rng.choice([0, -1])
    return (
        "Write a function `gcd_list(nums)` that returns the greatest common divisor of the positive integers "
        f"in `nums`, or {fallback} for an empty list.",
        "gcd_list",
        f"def gcd_list(nums):\n    if not nums:\n        return {fallback}\n    g = 0\n    for x in nums:\n"
        "        while x:\n            g, x = x, g % x\n    return g\n",
        lambda r: [[r.choice([2, 3, 4, 6]) * r.randint(1, 12) for _ in range(r.randint(0, 4))]],
    )


def fib_mod(rng):
    m = rng.choice([7, 10, 13, 100, 1000])
    return (
        f"Write a function `fib_mod(n)` that returns the n-th Fibonacci number modulo {m}, where fib(0) = 0 and "
        "fib(1) = 1.",
        "fib_mod",
        f"def fib_mod(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, (a + b) % {m}\n    return a\n",
        lambda r: [r.randint(0, 90)],
    )


FAMILIES: list[Family] = [
    sum_above,
    count_char,
    multiples,
    reverse_words,
    clamp_list,
    digit_sum,
    is_palindrome,
    running_total,
    second_largest,
    dedupe,
    caesar,
    count_primes,
    max_window,
    fizz,
    most_common,
    rotate,
    count_words,
    merge_sorted,
    bits,
    gcd_list,
    fib_mod,
]


def make_problem(rng: random.Random) -> dict[str, Any]:
    family = rng.choice(FAMILIES)
    statement, fn_name, solution, draw = family(rng)
    namespace: dict[str, Any] = {}
    exec(solution, namespace)  # our own reference code, never model output
    tests, seen = [], set()
    while len(tests) < PUBLIC_TESTS + HIDDEN_TESTS:
        args = draw(rng)
        key = json.dumps(args)
        if key in seen and len(seen) < 50:
            continue
        seen.add(key)
        tests.append({"input": args, "output": namespace[fn_name](*json.loads(key))})
    examples = "\n".join(
        f"{fn_name}({', '.join(repr(a) for a in t['input'])}) == {t['output']!r}" for t in tests[:PUBLIC_TESTS]
    )
    prompt = f"{statement}\nExamples:\n{examples}"
    return {"prompt": prompt, "fn_name": fn_name, "tests": tests, "public_tests": PUBLIC_TESTS, "solution": solution}


def make_problems(count: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [make_problem(rng) for _ in range(count)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the bundled synthetic coding set.")
    parser.add_argument("--count", type=int, default=520)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=default_data_path())
    args = parser.parse_args(argv)
    problems = make_problems(args.count, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as handle:
        for problem in problems:
            handle.write(json.dumps(problem, separators=(",", ":")) + "\n")
    print(f"wrote {len(problems)} problems to {args.out}")
    return 0
