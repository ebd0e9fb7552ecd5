"""`fit` on the search_qa recipe with the tiny model: two iterations of multi-turn rollouts against the BM25
retriever, an update each, validation and the rollouts file."""

import json
from pathlib import Path

from ragen_lit.cli import fit
from ragen_lit.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def test_fit_runs_two_iterations_on_search_qa(tmp_path, tiny_model_dir):
    overrides = [
        f"model.path={tiny_model_dir}",
        f"logging.output_dir={tmp_path}",
        "rollout.groups=2",
        "rollout.group_size=4",
        "rollout.max_new_tokens=48",
        "validation.num_envs=2",
        "validation.every_n_iterations=1",
        "diagnostics.every_n_iterations=1",
        "diagnostics.num_samples=4",
        "optim.num_minibatches=2",
        "optim.micro_batch_size=4",
        "trainer.threads=1",
        "trainer.iterations=2",
        "logging.save_rollouts=true",
    ]
    summary = fit(load_config(str(ROOT / "conf" / "search_qa.yaml"), overrides))
    assert summary["iterations"] == 2
    rollouts = sorted(next(tmp_path.glob("search_qa-*")).glob("rollouts/*.jsonl"))
    assert len(rollouts) == 2
    first = json.loads(rollouts[0].read_text().splitlines()[0])
    assert "Question: " in first["prompt"] and "Searches left: 3" in first["prompt"]
