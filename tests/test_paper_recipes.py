"""The paper-scale recipes (conf/paper/) load, validate, print through `python -m ragen_lit config`, hold the
paper's settings (docs/METHOD.md §7), and are exactly what scripts/make_configs.py
writes (so are the CPU recipes in conf/)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from ragen_lit.cli import main
from ragen_lit.config import load_config
from ragen_lit.run.preflight import check_env

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "conf" / "paper"
RECIPES = sorted(PAPER.glob("*.yaml"))
ENVS = {"frozenlake": "frozenlake", "sokoban": "sokoban", "countdown": "countdown", "metamathqa": "mathqa"}


def _make_configs():
    spec = importlib.util.spec_from_file_location("make_configs", ROOT / "scripts" / "make_configs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_one_recipe_per_paper_env_and_algorithm():
    assert [p.name for p in RECIPES] == sorted(f"{env}_{algo}.yaml" for env in ENVS for algo in ("ppo", "grpo"))


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_paper_recipe_loads_prints_and_has_the_papers_settings(path, tmp_path, capsys):
    cfg = load_config(str(path))
    check_env(cfg.env, cfg.rollout)  # the env options build an env
    lines = path.read_text().splitlines()
    assert lines[0] == f"# python -m ragen_lit fit --config conf/paper/{path.name}"
    assert "GPU" in lines[1] and "model.path=" in lines[1]

    assert main(["config", "--config", str(path)]) == 0
    printed = tmp_path / "printed.yaml"
    printed.write_text(capsys.readouterr().out)
    assert load_config(str(printed)) == cfg

    env, algo = path.stem.rsplit("_", 1)
    assert (cfg.env.name, cfg.algo.name) == (ENVS[env], algo)
    assert (cfg.model.name, cfg.model.path) == ("hf", "Qwen/Qwen2.5-3B-Instruct")
    # float32 weights with bf16 compute (a 1e-6 AdamW step on bfloat16 weights rounds away); vLLM in bfloat16
    assert (cfg.model.dtype, cfg.trainer.precision, cfg.rollout.dtype) == ("float32", "bf16-mixed", "bfloat16")
    r = cfg.rollout
    assert (r.groups, r.group_size, r.engine, r.gpu_memory_utilization) == (8, 16, "vllm", 0.3)
    assert (r.max_new_tokens, r.max_context_tokens, r.temperature) == (400, 3600, 1.0)
    assert (cfg.optim.actor_lr, cfg.optim.critic_lr, cfg.optim.num_minibatches) == (1e-6, 1e-5, 4)
    assert cfg.trainer.iterations == 400
    assert (cfg.filter.strategy, cfg.filter.value) == ("top_p", 0.9)
    assert (cfg.algo.entropy_coef, cfg.algo.kl_coef, cfg.algo.clip_low, cfg.algo.clip_high) == (0.001, 0.0, 0.2, 0.28)
    assert (cfg.validation.num_envs, cfg.validation.temperature, cfg.validation.every_n_iterations) == (512, 0.5, 10)
    if env in ("frozenlake", "sokoban"):
        assert (r.max_turns, r.max_actions_per_turn, r.max_actions_per_episode) == (5, 2, 10)
    else:
        assert (r.max_turns, r.max_actions_per_turn) == (1, 1)
    expected_options = {
        "frozenlake": {"size": 4, "p": 0.9, "success_rate": 1.0, "max_actions_per_episode": 10},
        "sokoban": {"size": 6, "num_boxes": 1, "search_depth": 300, "max_actions_per_episode": 10},
        "countdown": {},
        "metamathqa": {"max_attempts": 1},
    }
    assert cfg.env.options == expected_options[env]


def test_make_configs_output_matches_the_committed_files(tmp_path):
    written = _make_configs().write_all(tmp_path)
    committed = sorted((ROOT / "conf").rglob("*.yaml"))
    assert sorted(p.relative_to(tmp_path) for p in written) == [p.relative_to(ROOT / "conf") for p in committed]
    stale = [
        str(p.relative_to(tmp_path))
        for p in written
        if p.read_text() != (ROOT / "conf" / p.relative_to(tmp_path)).read_text()
    ]
    assert not stale, f"conf files differ from scripts/make_configs.py output (run it): {stale}"
