"""The key figures of `scripts/gpu_vllm.sh check`'s steps and its closing table, read from what the steps left in the
check's work folder (logs, MLflow's SQLite store, JSON reports). Standard library only: it runs after steps that may
have failed or been stopped, and reads whatever they got to write.

    python scripts/gpu_vllm_report.py figures KIND LOG WORK   # one line of key figures of a step (KIND: import,
                                                              # pytest, fit, evaluate, bench-vllm, bench-hf)
    python scripts/gpu_vllm_report.py table RESULTS           # the markdown table of the results (TSV: order, step,
                                                              # result, seconds, figures)
    python scripts/gpu_vllm_report.py collect WORK OUT        # the fit's curves, the evaluation and the benchmarks'
                                                              # JSON, copied to OUT (fit.json, evaluate.json, bench_*)
"""

from __future__ import annotations

import json
import math
import re
import shutil
import sys
from pathlib import Path

from ragen_lit.analysis.runs import load_runs
from ragen_lit.run.store import STORE_NAME, sqlite_uri

# the import step's lines: `import: <what it found>` and `missing: <modules>`
IMPORT_LINE = "import: "
MISSING_LINE = "missing: "
# pytest's closing summary (`3 passed, 1 skipped in 95.20s`) and a failed test's line
PYTEST_SUMMARY = re.compile(r"\b\d+ (passed|failed|skipped|error|errors|deselected)\b.* in [\d.]+s")
PYTEST_FAILED = re.compile(r"^(FAILED|ERROR) (\S+)")
SKIPPED = re.compile(r"^SKIPPED \[\d+\] \S+: (.*)")
# lines a test prints for the table (the sleep check's freed memory)
PRINTED = ("vLLM sleep level 2 freed",)
# bench_step's progress line of an iteration, for a run stopped before its JSON
BENCH_ITERATION = re.compile(r"\[bench\s+[\d.]+s\] (iteration \d+: .*)")


def _lines(log: Path) -> list[str]:
    try:
        return log.read_text(errors="replace").splitlines()
    except OSError:
        return []


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def import_figures(log: Path) -> str:
    lines = _lines(log)
    found = [line.removeprefix(IMPORT_LINE) for line in lines if line.startswith(IMPORT_LINE)]
    missing = [line.removeprefix(MISSING_LINE) for line in lines if line.startswith(MISSING_LINE)]
    parts = found[-1:] + [f"missing: {m}" for m in missing[-1:] if m]
    return "; ".join(parts) or _last_words(lines)


def pytest_figures(log: Path) -> str:
    lines = _lines(log)
    summary = [line.strip(" =") for line in lines if PYTEST_SUMMARY.search(line)]
    failed = [m.group(2).rsplit("::", 1)[-1] for line in lines if (m := PYTEST_FAILED.match(line))]
    skipped = sorted({m.group(1) for line in lines if (m := SKIPPED.match(line))})
    printed = [line.strip() for line in lines if line.strip().startswith(PRINTED)]
    parts = summary[-1:] + [f"failed: {', '.join(failed)}"] * bool(failed) + [f"skipped: {s}" for s in skipped]
    return "; ".join(parts + printed[-1:]) or _last_words(lines)


def fit_curves(work: Path) -> dict:
    """The check's fit: its validation success and log-prob gap by iteration, its run.json's summary."""
    store = work / "fit" / STORE_NAME
    fits = load_runs([sqlite_uri(store)]) if store.is_file() else []
    logged = fits[-1].metrics if fits else {}
    runs = sorted((work / "fit").glob("*/run.json"))
    record = _json(runs[-1]) if runs else None
    return {
        "val_success": logged.get("val/success", []),
        "logprob_gap": logged.get("rollout/logprob_gap", []),
        "rollout_success": logged.get("rollout/success", []),
        "summary": ((record or {}).get("finished") or {}).get("summary"),
        "run": str(runs[-1].parent) if runs else None,
    }


def fit_figures(work: Path) -> str:
    curves = fit_curves(work)
    val, gaps, rollouts = curves["val_success"], curves["logprob_gap"], curves["rollout_success"]
    parts = []
    if val:
        (first_step, first), (last_step, last) = val[0], val[-1]
        parts.append(f"val success {first:.3f} (it {first_step}) → {last:.3f} (it {last_step}), {last - first:+.3f}")
    if rollouts:
        parts.append(f"{rollouts[-1][0]} iterations trained")
    if gaps:
        values = [g for _, g in gaps]
        parts.append(f"log-prob gap mean {sum(values) / len(values):.4f}, max {max(values):.4f}")
    summary = curves["summary"]
    if summary and "wall_time_s" in summary:
        parts.append(f"fit wall {summary['wall_time_s']:.0f} s")
    return "; ".join(parts) or "no validation logged"


def evaluate_figures(work: Path) -> str:
    report = _json(work / "evaluate.json")
    if not report or not report.get("environments"):
        return "no evaluate.json"
    env = report["environments"][0]
    text = (
        f"success {env['success']:.3f} [{env['success_low']:.3f}, {env['success_high']:.3f}] over "
        f"{len(env['seeds'])} episodes in {env['seconds']:.0f} s"
    )
    final = (fit_curves(work)["summary"] or {}).get("val_success_final")
    if final is not None:
        text += f"; fit's final validation {final:.3f} ({'replayed exactly' if env['success'] == final else 'differs'})"
    return text


def bench_figures(work: Path, engine: str, log: Path) -> str:
    result = _json(work / f"bench_{engine}.json")
    if not result:
        iterations = [m.group(1) for line in _lines(log) if (m := BENCH_ITERATION.search(line))]
        return "; ".join(iterations[-2:]) or _last_words(_lines(log))
    step, throughput, roofline = result["step"], result["throughput"], result.get("roofline") or {}
    tokens_per_s = throughput["generation_tokens_per_s"]
    share = ""
    if roofline.get("tokens_per_s"):
        share = f" = {tokens_per_s / roofline['tokens_per_s']:.1%} of the bandwidth roofline"
    peaks = (result.get("peak_memory_gib") or {}).values()
    peak = f"peak {max(peaks):.1f} GiB allocated" if peaks else "peak memory n/a"
    first = (result.get("per_iteration") or [{}])[0]
    return (
        f"step {step['step_s']:.2f} s (generation {step['generation_s']:.2f}, update {step['update_s']:.2f}); "
        f"generation {tokens_per_s:,.0f} tokens/s{share}; {peak}; "
        f"iteration 0 generation {first.get('generation', math.nan):.1f} s (start-up, compilation)"
    )


def _last_words(lines: list[str]) -> str:
    text = [line.strip() for line in lines if line.strip()]
    return f"last line: {text[-1][:120]}" if text else "no output"


def figures(kind: str, log: Path, work: Path) -> str:
    if kind == "import":
        return import_figures(log)
    if kind == "pytest":
        return pytest_figures(log)
    if kind == "fit":
        return fit_figures(work)
    if kind == "evaluate":
        return evaluate_figures(work)
    if kind.startswith("bench-"):
        return bench_figures(work, kind.removeprefix("bench-"), log)
    raise ValueError(f"unknown kind {kind!r}")


def table(results: Path) -> str:
    rows = sorted(
        (line.split("\t") for line in results.read_text().splitlines() if line.strip()), key=lambda r: float(r[0])
    )
    out = ["| step | result | seconds | key figures |", "| --- | --- | ---: | --- |"]
    for _, step, result, seconds, *rest in rows:
        cell = (rest[0] if rest else "").replace("|", "/")
        out.append(f"| {step} | {result} | {seconds} | {cell} |")
    return "\n".join(out)


def collect(work: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    curves = fit_curves(work)
    if curves["run"] or curves["val_success"]:
        (out / "fit.json").write_text(json.dumps(curves, indent=1))
    for name in ("evaluate.json", "bench_vllm.json", "bench_hf.json"):
        if (work / name).is_file():
            shutil.copy(work / name, out / name)


def main(argv: list[str]) -> int:
    if argv[:1] == ["figures"] and len(argv) == 4:
        print(figures(argv[1], Path(argv[2]), Path(argv[3])))
    elif argv[:1] == ["table"] and len(argv) == 2:
        print(table(Path(argv[1])))
    elif argv[:1] == ["collect"] and len(argv) == 3:
        collect(Path(argv[1]), Path(argv[2]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
