"""What a run was made from: the source commit of the ragen_lit code and the sha256 of the weights it started from.

`fit` tags every new MLflow run with both (`ragen_lit.commit`, `ragen_lit.commit_dirty`, `ragen_lit.weights_sha256`)
and `warm-start` writes them into its record, so a result names the code and the weights behind it."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
"""files that hold a model's weights (a folder's other files — config, tokenizer — are not hashed)"""


COMMIT_ENV = "RAGEN_LIT_COMMIT"
"""names the commit of a tree that is not that commit's git checkout (a copy of a working tree, a container image):
`<hash>`, or `<hash>+dirty` for one with changes; it wins over git"""


def source_commit(folder: Path | None = None) -> tuple[str, bool] | None:
    """(commit hash, whether tracked files have uncommitted changes) of the ragen_lit source in use: `COMMIT_ENV` where
    set, else the git checkout holding `folder` (default: this package); None outside a git checkout (a wheel)."""
    named = os.environ.get(COMMIT_ENV, "").strip()
    if named:
        commit, _, dirty = named.partition("+")
        return commit, dirty == "dirty"
    folder = folder or Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return None
    return commit, bool(git("status", "--porcelain", "--untracked-files=no"))


def weights_sha256(path: str | Path) -> str | None:
    """sha256 over the weight files of a model folder (or one weight file): each file's name and bytes, in name
    order, so the same weights under the same names give the same digest. None for a path that is not on this
    machine (a hub id resolved later) or holds no weight file."""
    path = Path(path).expanduser()
    files = [path] if path.is_file() else sorted(p for p in path.glob("*") if p.suffix in WEIGHT_SUFFIXES)
    if not path.exists() or not files:
        return None
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode() + b"\0")
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def commit_tags() -> dict[str, str]:
    """The MLflow tags naming the code: `ragen_lit.commit` and `ragen_lit.commit_dirty` (none outside a checkout)."""
    commit = source_commit()
    if commit is None:
        return {}
    return {"ragen_lit.commit": commit[0], "ragen_lit.commit_dirty": str(commit[1]).lower()}


def run_tags(model_path: str) -> dict[str, str]:
    """The MLflow tags of a new run: commit, dirty flag and the starting weights' digest (those known here)."""
    tags = commit_tags()
    digest = weights_sha256(model_path)
    if digest is not None:
        tags["ragen_lit.weights_sha256"] = digest
    return tags
