"""Countdown: combine the given numbers, each exactly once, with + - * / into the target.

Instances are generated from the seed (3 or 4 numbers, a random full combination of them gives the
target), so every instance is solvable; `solve` is an exhaustive solver for tests and benchmarks. With
`path` they are read instead from a JSONL, JSON-array or parquet file of Countdown-Tasks records (the
format of Jiayi-Pan/Countdown-Tasks-3to4 on the HF hub, which TinyZero and RAGEN train on: `target`, an
integer, and `nums`, the list of numbers); the instance of seed s is record `s % len(records)`.
The single action is an arithmetic expression; it is scored as in the reference (docs/METHOD.md §6, Countdown):
1 if it uses exactly the given numbers and equals the target (|difference| < 1e-5), 0.1 if it uses exactly the
given numbers but has another value, 0 otherwise.

Answers are never `eval`-ed: `safe_evaluate` parses them with `ast` and accepts only integer
literals, the four binary operators, unary minus and parentheses, with caps on length, literal
size and nesting depth, so a hostile answer is rejected in well under a millisecond.
"""

from __future__ import annotations

import ast
import functools
import operator
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from ragen_lit.envs.base import OptionError, TextEnv, check_int
from ragen_lit.envs.records import existing_file, read_known_records

CORRECT_REWARD = 1.0
FORMAT_REWARD = 0.1  # right numbers, wrong value
TOLERANCE = 1e-5
MAX_ANSWER_LENGTH = 200
MAX_LITERAL = 10**6
MAX_DEPTH = 32
BINARY_OPERATORS: dict[type[ast.operator], Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
# format -> the fields its records need (Countdown-Tasks: the target and the numbers)
FORMATS = {"countdown_tasks": ("target", "nums")}
MAX_NUMBERS = 6
# Models write the signs the way people do; map them to Python's before parsing.
SIGN_ALIASES = str.maketrans({"×": "*", "÷": "/", "−": "-"})


def safe_evaluate(expression: str) -> tuple[Fraction, list[int]]:
    """The exact value of an arithmetic `expression` and the integer literals it uses (in order).

    Raises ValueError (saying why) for anything but integer literals <= 10**6, `+ - * /`, unary
    minus and parentheses; for an expression over 200 characters or nested deeper than 32; and for
    a division by zero.
    """
    if not isinstance(expression, str) or len(expression) > MAX_ANSWER_LENGTH:
        raise ValueError(f"the answer must be a string of at most {MAX_ANSWER_LENGTH} characters")
    try:
        tree = ast.parse(expression.translate(SIGN_ALIASES).strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as error:
        raise ValueError(f"the answer is not an arithmetic expression ({type(error).__name__})") from None
    literals: list[int] = []
    value = _evaluate(tree.body, literals, depth=0)
    return value, literals


def _evaluate(node: ast.expr, literals: list[int], depth: int) -> Fraction:
    if depth > MAX_DEPTH:
        raise ValueError(f"the answer is nested deeper than {MAX_DEPTH}")
    if isinstance(node, ast.Constant):
        # bool is an int subclass: `True + 1` must not pass as arithmetic.
        if type(node.value) is not int or abs(node.value) > MAX_LITERAL:
            raise ValueError(f"only integer literals up to {MAX_LITERAL} are allowed, got {node.value!r:.20}")
        literals.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand, literals, depth + 1)
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY_OPERATORS:
        left = _evaluate(node.left, literals, depth + 1)
        right = _evaluate(node.right, literals, depth + 1)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ValueError("the answer divides by zero")
        return BINARY_OPERATORS[type(node.op)](left, right)
    what = type(node.op).__name__ if isinstance(node, (ast.BinOp, ast.UnaryOp)) else type(node).__name__
    raise ValueError(f"{what} is not allowed; only numbers, + - * /, unary minus and parentheses")


def score_answer(answer: str, numbers: Sequence[int], target: int) -> float:
    """The reference's Countdown reward for `answer` (1, 0.1 or 0; see the module docstring)."""
    try:
        value, literals = safe_evaluate(answer)
    except ValueError:
        return 0.0
    if sorted(literals) != sorted(numbers):
        return 0.0
    return CORRECT_REWARD if abs(value - target) < TOLERANCE else FORMAT_REWARD


def solve(numbers: Sequence[int], target: int) -> str | None:
    """An expression using every number exactly once that equals `target`, or None if none does
    (exhaustive search over pairwise combinations with exact fractions)."""
    failed: set[tuple[Fraction, ...]] = set()

    def search(pool: list[tuple[Fraction, str]]) -> str | None:
        if len(pool) == 1:
            return pool[0][1] if pool[0][0] == target else None
        key = tuple(sorted(value for value, _ in pool))
        if key in failed:
            return None
        for i in range(len(pool)):
            for j in range(i + 1, len(pool)):
                (a, ea), (b, eb) = pool[i], pool[j]
                rest = [pool[k] for k in range(len(pool)) if k not in (i, j)]
                candidates = [
                    (a + b, f"{ea} + {eb}"),
                    (a * b, f"{ea} * {eb}"),
                    (a - b, f"{ea} - {eb}"),
                    (b - a, f"{eb} - {ea}"),
                ]
                if b != 0:
                    candidates.append((a / b, f"{ea} / {eb}"))
                if a != 0:
                    candidates.append((b / a, f"{eb} / {ea}"))
                for value, text in candidates:
                    found = search(rest + [(value, f"({text})")])
                    if found is not None:
                        return found
        failed.add(key)
        return None

    if not numbers:
        return None
    found = search([(Fraction(n), str(n)) for n in numbers])
    return found[1:-1] if found is not None and len(numbers) > 1 else found


def _random_combination(numbers: list[int], rng: np.random.Generator) -> int:
    """Combine all `numbers` in a random order with random operators, keeping every intermediate
    result a positive integer (+ and * always qualify; - and / only when they do)."""
    pool = list(numbers)
    while len(pool) > 1:
        i, j = rng.choice(len(pool), size=2, replace=False)
        a, b = pool[i], pool[j]
        results = [a + b, a * b]
        if a > b:
            results.append(a - b)
        if b > 1 and a % b == 0:
            results.append(a // b)
        pool = [pool[k] for k in range(len(pool)) if k not in (i, j)] + [int(results[rng.integers(len(results))])]
    return pool[0]


def generate_instance(seed: int, max_number: int = 99, max_target: int = 100) -> tuple[list[int], int]:
    """3 or 4 numbers in 1..max_number and a target in 1..max_target reachable from all of them."""
    rng = np.random.default_rng(seed)
    while True:
        count = int(rng.integers(3, 5))
        numbers = [int(n) for n in rng.integers(1, max_number + 1, size=count)]
        target = _random_combination(numbers, rng)
        if 1 <= target <= max_target:
            return numbers, target


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def load_instances(path: str, format: str = "auto") -> tuple[tuple[tuple[int, ...], int], ...]:
    """The (numbers, target) instances of a Countdown-Tasks file; cached per file, modification time and format."""
    file = existing_file(path)
    return _load_cached(str(file.resolve()), file.stat().st_mtime_ns, format)


@functools.lru_cache(maxsize=8)
def _load_cached(file: str, mtime_ns: int, format: str) -> tuple[tuple[tuple[int, ...], int], ...]:
    records, _ = read_known_records(file, FORMATS, format, "instance")
    instances = []
    for index, record in enumerate(records):
        numbers, target = record["nums"], record["target"]
        if (
            not isinstance(numbers, (list, tuple))
            or not 1 <= len(numbers) <= MAX_NUMBERS
            or not all(_is_count(n) and n >= 1 for n in numbers)
            or not _is_count(target)
        ):
            raise OptionError(
                "path",
                file,
                f"an integer target and 1 to {MAX_NUMBERS} positive integer nums per record "
                f"(record {index} has target={target!r:.40}, nums={numbers!r:.60})",
            )
        instances.append((tuple(numbers), target))
    return tuple(instances)


def observation_text(numbers: Sequence[int], target: int) -> str:
    return f"Target: {target}\nNumbers: {list(numbers)}"


class CountdownEnv(TextEnv):
    """Single-turn Countdown. Public state: `numbers`, `target`."""

    instruction = (
        "You are solving the Countdown puzzle. Combine all the given numbers, each exactly once, with "
        "+, -, * and / (parentheses allowed) into an expression that equals the target. Answer with "
        "the expression only, for example (6 - 2) * 5 + 4."
    )
    actions = None

    def __init__(
        self,
        max_number: int = 99,
        max_target: int = 100,
        path: str | None = None,
        format: str = "auto",
        render_mode: str | None = None,
    ) -> None:
        self.max_number = check_int("max_number", max_number, 1)
        self.max_target = check_int("max_target", max_target, 1)
        # read from `path`; max_number and max_target shape generated instances only
        self.instances = load_instances(path, format) if path is not None else None
        self.path, self.format = path, format
        self._fixed_instance: tuple[list[int], int] | None = None
        self.numbers: list[int] = []
        self.target = 0
        self._solved = False
        bound = 60 + 5 * len(str(max(self.max_number, self.max_target)))
        if self.instances is not None:
            bound = max(len(observation_text(numbers, target)) for numbers, target in self.instances)
        super().__init__(max_actions_per_episode=1, observation_max_length=bound, render_mode=render_mode)

    @classmethod
    def from_instance(cls, numbers: Sequence[int], target: int, **options: Any) -> CountdownEnv:
        """An env that always poses `numbers` -> `target`."""
        if (
            not numbers
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in numbers)
            or len(numbers) > MAX_NUMBERS
        ):
            raise OptionError("numbers", list(numbers), f"1 to {MAX_NUMBERS} positive integers")
        if isinstance(target, bool) or not isinstance(target, int):
            raise OptionError("target", target, "an integer")
        env = cls(**options)
        env._fixed_instance = (list(numbers), target)
        length = len(observation_text(numbers, target))
        env.observation_space = type(env.observation_space)(
            max_length=max(length, env.observation_space.max_length), charset=env.observation_space.character_set
        )
        return env

    # ----------------------------------------------------------------------------- TextEnv hooks
    @property
    def item_count(self) -> int | None:
        if self._fixed_instance is not None:
            return 1
        return len(self.instances) if self.instances is not None else None

    def _new_episode(self, seed: int) -> None:
        if self._fixed_instance is not None:
            numbers, self.target = self._fixed_instance
            self.numbers = list(numbers)
        elif self.instances is not None:
            numbers, self.target = self.instances[seed % len(self.instances)]
            self.numbers = list(numbers)
        else:
            self.numbers, self.target = generate_instance(seed, self.max_number, self.max_target)
        self._solved = False

    @property
    def is_success(self) -> bool:
        return self._solved

    def _apply(self, action: str) -> tuple[float, bool]:
        reward = score_answer(action, self.numbers, self.target)
        self._solved = reward == CORRECT_REWARD
        return reward, True

    def _observation(self) -> str:
        return observation_text(self.numbers, self.target)
