"""Write a randomly initialised Qwen2.5-shaped causal LM (bf16) and the offline env-text tokenizer to a folder,
for `model.path=FOLDER` runs that need a real-size model without hub access (scale-out checks, FSDP). It is
the model `scripts/bench_step.py` measures (`bench.random_model`): Qwen2.5-0.5B's shape, or with
`--model qwen2.5-3b` Qwen2.5-3B's.

    python scripts/make_random_model.py /tmp/qwen05b-random           # Qwen2.5-0.5B shape (494M parameters)
    python scripts/make_random_model.py /tmp/qwen3b-random --model qwen2.5-3b   # Qwen2.5-3B shape (3.09B parameters)
    python scripts/make_random_model.py /tmp/tiny-random --smoke      # 2 layers, hidden 64: a quick CPU check

A random model's rewards are all equal (every turn gets the format penalty), so train it with
`filter.strategy=none`: the default filter would keep nothing and no update would run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from bench.random_model import DEFAULT_SHAPE, QWEN_SHAPES, SMOKE, write_random_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="output folder (created; must be empty or missing)")
    parser.add_argument("--model", choices=list(QWEN_SHAPES), default=DEFAULT_SHAPE, help="the architecture")
    parser.add_argument("--smoke", action="store_true", help="a tiny Qwen2 with the same tokenizer (overrides --model)")
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="where to initialise (default: cuda if available)",
    )
    args = parser.parse_args(argv)
    if args.folder.exists() and any(args.folder.iterdir()):
        parser.error(f"{args.folder} exists and is not empty")
    args.folder.mkdir(parents=True, exist_ok=True)
    config = write_random_model(args.folder, SMOKE if args.smoke else args.model, torch.device(args.device))
    print(
        f"wrote {args.folder}: Qwen2 hidden {config.hidden_size}, {config.num_hidden_layers} layers, "
        f"vocabulary {config.vocab_size}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
