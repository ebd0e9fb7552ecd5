"""The seeds a run derives for its random draws other than the environments': one named stream each, one formula.

An iteration draws, besides its environments' tasks (`rollout.seed`, `training.data.train_seeds`):
- `ROLLOUT_SAMPLING`: the tokens the engine samples in the iteration's rollouts (from `trainer.seed`; dynamic
  sampling's extra rounds offset it by `training.data.ROUND_SEED_STRIDE` per round);
- `MINIBATCH_ORDER`: which kept rows go into which mini-batch (from `trainer.seed`);
- `DIAGNOSTIC_DRAWS`: which reasonings and prompts the collapse diagnostics cross-score (from the iteration alone,
  so every rank, and every `trainer.seed`, draws the same positions).
Each stream's seed is `derive_seed(base, stream, offset) = base * stream + offset`, the offset the iteration. Within
a stream, two (seed, iteration) pairs get different seeds while the iteration stays below the multiplier. The
multipliers are distinct primes, so that for a `trainer.seed` above 0 the sampling and mini-batch streams of an
iteration start from different seeds (with `trainer.seed` itself for both, the engine and the mini-batch shuffle
would start from one); at `trainer.seed=0` both are the iteration, and only their different generators tell them
apart.

These are the values every run so far has used: the runs on the results page reproduce bit for bit from them, and
`tests/test_seeds.py` holds them. A new multiplier or formula changes every run.
"""

from __future__ import annotations

ROLLOUT_SAMPLING = 100_003
MINIBATCH_ORDER = 7_919
DIAGNOSTIC_DRAWS = 1_000_003


def derive_seed(base: int, stream: int, offset: int = 0) -> int:
    """The seed of `stream` (one of the multipliers above) for `base` (the run's seed, or the iteration) and
    `offset`: `base * stream + offset`."""
    return base * stream + offset
