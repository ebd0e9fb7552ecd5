"""Learning sweep for the default CPU recipe (docs/DEFAULT_RECIPE.md): build tiny-model variants, then
run many `fit`s of conf/frozenlake.yaml at once and print each run's validation curve.

    python scripts/sweep_recipe.py EXPERIMENTS.json [--parallel 14] [--out DIR] [--fit-timeout 480]

EXPERIMENTS.json is a list of {"name": str, "recipe": {TinyRecipe field: value}, "overrides": [key=value]};
each distinct recipe is built once (under DIR/models), every fit writes under DIR/<name>. Give each run
one thread (`trainer.threads=1` in its overrides, `"threads": 1` in its recipe) and run at most as many
as there are cores: oversubscribed torch threads slow everything down many times over. Lines go to
stdout and DIR/sweep.txt: `BUILD <recipe> -> <summary>` and
`FIT <name> rc=<exit> wall=<s> val=[(iteration, success), ...] train=[rollout success per iteration]`.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUILD = (
    "import sys, json, dataclasses; from pathlib import Path; "
    "from ragen_lit.presets.tiny.build import TinyRecipe, build_tiny_model; "
    "build_tiny_model(Path(sys.argv[2]), recipe=dataclasses.replace(TinyRecipe(), **json.loads(sys.argv[1])))"
)


def recipe_key(experiment: dict) -> str:
    return json.dumps(experiment.get("recipe", {}), sort_keys=True)


def build(key: str, models: Path) -> tuple[str, Path, str]:
    folder = models / hashlib.sha1(key.encode()).hexdigest()[:10]
    start = time.time()
    proc = subprocess.run([sys.executable, "-c", BUILD, key, str(folder)], capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    info = lines[-1] if proc.returncode == 0 and lines else f"FAILED: {proc.stderr[-1500:]}"
    return key, folder, f"BUILD {key} -> {info} ({time.time() - start:.0f}s)"


def history(db: Path, key: str) -> list:
    with sqlite3.connect(db) as con:
        return list(con.execute("select step, round(value, 3) from metrics where key = ? order by step", (key,)))


def fit(experiment: dict, folder: Path, out: Path, timeout: int) -> str:
    run_dir = out / experiment["name"]
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "ragen_lit",
        "fit",
        "--config",
        str(REPO / "conf" / "frozenlake.yaml"),
        "model.name=hf",
        f"model.path={folder}",
        f"logging.output_dir={run_dir}",
        "trainer.accelerator=cpu",
        *experiment.get("overrides", []),
    ]
    start = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        status, tail = proc.returncode, "" if proc.returncode == 0 else proc.stderr[-1500:]
    except subprocess.TimeoutExpired:
        status, tail = "timeout", ""
    db = run_dir / "mlruns.db"
    val = history(db, "val/success") if db.exists() else []
    train = [v for _, v in history(db, "rollout/success")] if db.exists() else []
    return (
        f"FIT {experiment['name']} rc={status} wall={time.time() - start:.0f}s val={val} train={train} {tail}".rstrip()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiments", type=Path)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("sweep_out"))
    parser.add_argument("--fit-timeout", type=int, default=480)
    args = parser.parse_args()
    experiments = json.loads(args.experiments.read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    log = (args.out / "sweep.txt").open("a")

    def say(line: str) -> None:
        print(line, flush=True)
        log.write(line + "\n")
        log.flush()

    folders = {}
    with cf.ThreadPoolExecutor(args.parallel) as pool:
        for key, folder, line in pool.map(
            lambda k: build(k, args.out / "models"), sorted({recipe_key(e) for e in experiments})
        ):
            folders[key] = folder
            say(line)
    with cf.ThreadPoolExecutor(args.parallel) as pool:
        for line in pool.map(lambda e: fit(e, folders[recipe_key(e)], args.out, args.fit_timeout), experiments):
            say(line)


if __name__ == "__main__":
    main()
