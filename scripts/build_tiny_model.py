"""Build the embedded default model `model: tiny` (tokenizer + small Qwen3 LM, SFT-warm-started).

    python scripts/build_tiny_model.py                 # into the user cache (reused if already built)
    python scripts/build_tiny_model.py --out DIR --force
    python scripts/build_tiny_model.py --out DIR --extra-envs coding,search_qa,webshop   # warm-start on those too

`model.name=tiny` loads the folder shipped in the package (`ragen_lit/presets/tiny/shipped/`, made by
this script: docs/DEFAULT_RECIPE.md); build your own draw here and pass it as `model.path=DIR`. It prints
the one-line summary (parameters, SFT steps, final loss, validation success at T=0.5, timings).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ragen_lit.envs import ENV_CLASSES
from ragen_lit.presets.cache import default_cache_dir
from ragen_lit.presets.tiny.build import BUILD_INFO, FOLDER_NAME, TINY_ENVS, TinyRecipe, build_tiny_model


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
    args = parser.parse_args()
    extra = tuple(e.strip() for e in args.extra_envs.split(",") if e.strip())
    unknown = [e for e in extra if e not in ENV_CLASSES]
    if unknown:
        parser.error(f"--extra-envs {unknown[0]!r} is not an environment; allowed: {', '.join(sorted(ENV_CLASSES))}")
    folder = build_tiny_model(args.out, force=args.force, recipe=TinyRecipe(extra_envs=extra))
    print(f"tiny model folder: {folder} (build record: {folder / BUILD_INFO})")


if __name__ == "__main__":
    main()
