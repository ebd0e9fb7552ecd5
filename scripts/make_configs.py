"""Regenerate conf/*.yaml from the config dataclasses (one source of truth: every field, its default
for that recipe, and its doc as a comment). Run: python scripts/make_configs.py"""
from __future__ import annotations

from pathlib import Path

from ragen_lit.config import load_config, render_yaml

CONF = Path(__file__).resolve().parents[1] / "conf"

# The CPU recipes use the embedded tiny model; the overrides are what differs from the dataclass
# defaults (which follow the paper: 8 groups x 16 rollouts, PPO, linear top-p 0.9).
# GRPO (no critic) with 16 prompts x 8 rollouts keeps an iteration to ~6 s on 2 idle cores. From
# sweeps over tiny-model builds and seeds (docs/PERFORMANCE.md): 16 prompts learned faster and more
# steadily than 8 or 32 per iteration, and actor lr 5e-4 more than 3e-4 or 7e-4 (1e-3 drifts).
TINY_CPU = ["algo=grpo", "rollout.groups=16", "rollout.group_size=8", "optim.actor_lr=5e-4", "trainer.threads=2", "trainer.iterations=40"]
RECIPES = {
    "frozenlake": (
        "FrozenLake 4x4 (deterministic), GRPO + SNR-aware filtering, tiny model on CPU (paper-scale: algo=ppo rollout.group_size=16)",
        ["env.name=frozenlake", "env.options={size: 4, p: 0.8, success_rate: 1.0}", "validation.num_envs=256", *TINY_CPU],
    ),
    "frozenlake_slippery": (
        "FrozenLake 4x4 with slip: the intended move succeeds w.p. success_rate (sweep: env.options.success_rate=0.5 ...)",
        ["env.name=frozenlake", "env.options={size: 4, p: 0.8, success_rate: 0.8}", *TINY_CPU],
    ),
    "sokoban": (
        "Sokoban 6x6, one box, at most 10 actions; GRPO + SNR-aware filtering",
        ["env.name=sokoban", "env.options={size: 6, num_boxes: 1}", *TINY_CPU],
    ),
    "countdown": (
        "Countdown (single turn: one arithmetic expression), GRPO + SNR-aware filtering",
        ["env.name=countdown", "rollout.max_turns=1", "rollout.max_actions_per_turn=1", *TINY_CPU],
    ),
    "metamathqa": (
        "MetaMathQA-style QA (single turn; bundled synthetic set, or env.options.path=FILE.jsonl/.parquet)",
        ["env.name=mathqa", "rollout.max_turns=1", "rollout.max_actions_per_turn=1", *TINY_CPU],
    ),
}


def main() -> None:
    for name, (description, overrides) in RECIPES.items():
        cfg = load_config(None, overrides)
        header = f"# python -m ragen_lit fit --config conf/{name}.yaml\n# {description}\n# Regenerate with: python scripts/make_configs.py"
        (CONF / f"{name}.yaml").write_text(render_yaml(cfg, header))
        print(f"wrote conf/{name}.yaml")


if __name__ == "__main__":
    main()
