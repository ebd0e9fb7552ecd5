"""How long the command line takes to answer when it has no training to do: `--help`, a config that fails to load,
a printed config, refusals by the env registry and by this machine's bounds. Each command runs as its own process
(`python -m ragen_lit ...`, the interpreter's start included) a few times; the table gives the fastest, median and
slowest wall time, and whether torch, transformers or Lightning were imported (one more run with `-X importtime`, not
timed).

    python scripts/bench_cli.py              # 5 runs of each command
    python scripts/bench_cli.py --repeats 10
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONF = "conf/frozenlake.yaml"
COMMANDS = {
    "--help": ["--help"],
    "fit --help": ["fit", "--help"],
    "sweep --help": ["sweep", "--help"],
    "fit, config error (filter.value=7)": ["fit", "--config", CONF, "filter.value=7"],
    "fit, unquoted value (iter-epoch=1)": ["fit", "--config", CONF, "trainer.resume=runs/x/iter-epoch=1.ckpt"],
    "config (prints the resolved config)": ["config", "--config", CONF],
    "fit, unknown env (env.name=chess)": ["fit", "--config", CONF, "env.name=chess"],
    "fit, env option (env.options.size=100000)": ["fit", "--config", CONF, "env.options.size=100000"],
    "fit, too many threads (trainer.threads=100000)": ["fit", "--config", CONF, "trainer.threads=100000"],
    "fit, host memory (rollout.groups=1000000000)": ["fit", "--config", CONF, "rollout.groups=1000000000"],
    "config, unknown env (env.name=chess)": ["config", "--config", CONF, "env.name=chess"],
    "sweep, unknown env (env.name=frozenlake,chess)": ["sweep", "--config", CONF, "env.name=frozenlake,chess"],
}
HEAVY = ("torch", "transformers", "lightning")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def timed(args: list[str]) -> tuple[float, int]:
    """(wall seconds, exit code) of one `python -m ragen_lit ARGS`."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "ragen_lit", *args], cwd=ROOT, capture_output=True)
    return time.perf_counter() - started, done.returncode


def heavy_imports(args: list[str]) -> list[str]:
    """Which of torch, transformers and Lightning `python -m ragen_lit ARGS` imports."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "ragen_lit", *args], cwd=ROOT, capture_output=True, text=True
    )
    modules = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    return sorted({name.split(".")[0] for name in modules} & set(HEAVY))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs of each command (default 5)")
    repeats = parser.parse_args().repeats
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}")
    print(f"commit: {commit()}")
    print(f"each command {repeats} times, wall time of the whole process\n")
    print("| command | exit | fastest (s) | median (s) | slowest (s) | heavy imports |")
    print("|---|---|---|---|---|---|")
    for name, args in COMMANDS.items():
        runs = [timed(args) for _ in range(repeats)]
        times = [seconds for seconds, _ in runs]
        print(
            f"| {name} | {runs[0][1]} | {min(times):.2f} | {statistics.median(times):.2f} | {max(times):.2f} "
            f"| {', '.join(heavy_imports(args)) or 'none'} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
