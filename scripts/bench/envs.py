"""Benchmark the environment generators and the Countdown answer checker on this machine.

Prints the machine and date, then one row per generator: milliseconds per `reset(seed)` (which
builds the instance of that seed), mean / p95 / max over seeds `train_seed_base ...`. The budget is
50 ms per room. Then the Sokoban optimal-solution lengths (from the BFS solver: how many generated
rooms fit the 10-action budget) and the time the safe evaluator takes to reject hostile answers.
Entry point: `scripts/bench_envs.py`.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import time
from collections.abc import Callable

import numpy as np

from bench.machine import cpu_name
from ragen_lit.envs import CountdownEnv, FrozenLakeEnv, MathQAEnv, SokobanEnv, TextEnv
from ragen_lit.envs.countdown import safe_evaluate
from ragen_lit.envs.sokoban import solve

BUDGET_MS = 50.0
HOSTILE_ANSWERS = {
    "import call": "__import__('os').system('true')",
    "attribute": "(1).__class__.__bases__",
    "power": "9**9**9**9",
    "huge literal": "9" * 200,
    "over-long": "1+" * 5000 + "1",
    "deep parentheses": "(" * 99 + "1" + ")" * 99,  # harmless (just 1): parentheses make no AST nodes
    "deep unary minus": "-" * 199 + "1",
    "division by zero": "(3 - 3) / (2 - 2) + 1 / 0",
    "lambda": "(lambda: 1)()",
    "string": "'a' * 10**8",
}


def machine() -> str:
    return f"{cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"


def time_resets(env: TextEnv, seeds: range) -> np.ndarray:
    """Milliseconds per `env.reset(seed=s)` for every seed."""
    times = []
    for seed in seeds:
        start = time.perf_counter()
        env.reset(seed=seed)
        times.append((time.perf_counter() - start) * 1000.0)
    return np.array(times)


def time_call(function: Callable[[], object]) -> float:
    start = time.perf_counter()
    function()
    return (time.perf_counter() - start) * 1000.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=500, help="seeds per generator (default 500)")
    args = parser.parse_args(argv)
    seeds = range(TextEnv.train_seed_base, TextEnv.train_seed_base + args.instances)

    print(f"machine: {machine()}")
    print(f"date:    {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}")
    print(f"instances per generator: {args.instances}; budget {BUDGET_MS:.0f} ms per room\n")

    generators = {
        "FrozenLake 4x4 p=0.8": FrozenLakeEnv(),
        "FrozenLake 8x8 p=0.8": FrozenLakeEnv(size=8),
        "Sokoban 6x6 1 box depth 300": SokobanEnv(),
        "Sokoban 8x8 2 boxes depth 300": SokobanEnv(size=8, num_boxes=2),
        "Countdown 3-4 numbers": CountdownEnv(),
        "MathQA bundled set": MathQAEnv(),
    }
    print(f"{'generator':32s} {'mean ms':>9s} {'p95 ms':>9s} {'max ms':>9s}  within budget")
    for name, env in generators.items():
        ms = time_resets(env, seeds)
        verdict = "yes" if ms.max() <= BUDGET_MS else "NO"
        print(f"{name:32s} {ms.mean():9.3f} {np.percentile(ms, 95):9.3f} {ms.max():9.3f}  {verdict}")

    print("\nSokoban optimal solution length (BFS), generated rooms")
    print(f"{'room':32s} {'mean':>6s} {'median':>6s} {'max':>5s} {'<= 10 moves':>12s} {'solve mean ms':>14s}")
    for name, env in list(generators.items())[2:4]:
        lengths, solve_ms = [], []
        for seed in seeds:
            env.reset(seed=seed)
            start = time.perf_counter()
            solution = solve(env.grid)
            solve_ms.append((time.perf_counter() - start) * 1000.0)
            if solution is None:
                raise SystemExit(f"{name}: seed {seed} generated an unsolvable room")
            lengths.append(len(solution))
        lengths = np.array(lengths)
        print(
            f"{name:32s} {lengths.mean():6.2f} {np.median(lengths):6.1f} {lengths.max():5d} "
            f"{(lengths <= 10).mean():12.1%} {np.mean(solve_ms):14.2f}"
        )

    print("\nCountdown safe evaluator, hostile answers (each must be rejected within 50 ms)")
    print(f"{'answer':20s} {'ms':>8s}  outcome")
    for name, answer in HOSTILE_ANSWERS.items():
        outcome = "accepted"

        def check(answer: str = answer) -> None:
            nonlocal outcome
            try:
                safe_evaluate(answer)
            except ValueError as error:
                outcome = f"rejected: {error}"[:70]

        ms = time_call(check)
        print(f"{name:20s} {ms:8.3f}  {outcome}")
    return 0
