"""Build the embedded default model `model: tiny` (tokenizer + small Qwen3 LM, SFT-warm-started).

    python scripts/build_tiny_model.py                 # into the user cache (reused if already built)
    python scripts/build_tiny_model.py --out DIR --force
    python scripts/build_tiny_model.py --out DIR --extra-envs coding,search_qa,webshop   # warm-start on those too

`model.name=tiny` loads the folder shipped in the package (`ragen_lit/presets/tiny/shipped/`, made by
this script: docs/DEFAULT_RECIPE.md); build your own draw here and pass it as `model.path=DIR`. An extra
env's expert episodes and its validation use the env options and rollout limits of its `conf/<env>.yaml`,
the ones `fit --config conf/<env>.yaml` plays it with. The recipe options below default to the shipped
model's recipe. It prints the one-line summary (parameters, SFT steps, final loss, validation success at
T=0.5, timings).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from ragen_lit.config import load_config
from ragen_lit.envs import ENV_CLASSES
from ragen_lit.presets.cache import default_cache_dir
from ragen_lit.presets.tiny.build import (
    BUILD_INFO,
    FOLDER_NAME,
    TINY_ENVS,
    EnvSetup,
    TinyRecipe,
    build_tiny_model,
)

CONF = Path(__file__).resolve().parents[1] / "conf"
# TinyRecipe fields a build of your own may change from the command line (e.g. --extra-env-episodes 400)
RECIPE_OPTIONS = (
    "extra_env_episodes",
    "sft_episodes",
    "other_env_episodes",
    "sft_steps",
    "hidden_size",
    "intermediate_size",
    "num_layers",
    "num_heads",
    "val_envs",
    "max_attempts",
    "seed",
    "threads",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=None, help=f"model folder (default: {default_cache_dir() / FOLDER_NAME})"
    )
    parser.add_argument(
        "--force", action="store_true", help="rebuild even if the folder already holds this recipe's model"
    )
    parser.add_argument(
        "--extra-envs",
        default="",
        help=f"comma-separated envs to warm-start on besides {', '.join(TINY_ENVS)} (e.g. coding,search_qa,webshop)",
    )
    defaults = TinyRecipe()
    for name in RECIPE_OPTIONS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    args = parser.parse_args()
    extra = [e.strip() for e in args.extra_envs.split(",") if e.strip()]
    allowed = sorted(set(ENV_CLASSES) - set(TINY_ENVS))
    unknown = [e for e in extra if e not in allowed]
    if unknown:
        parser.error(
            f"--extra-envs {unknown[0]!r} is not an environment beyond the built-in four; allowed: {', '.join(allowed)}"
        )
    configs = [load_config(str(CONF / f"{e}.yaml")) for e in extra]
    recipe = dataclasses.replace(
        defaults,
        extra_envs=tuple(EnvSetup.of(c.env, c.rollout) for c in configs),
        **{name: getattr(args, name) for name in RECIPE_OPTIONS},
    )
    folder = build_tiny_model(args.out, force=args.force, recipe=recipe)
    print(f"tiny model folder: {folder} (build record: {folder / BUILD_INFO})")


if __name__ == "__main__":
    main()
