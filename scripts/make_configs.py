"""Regenerate conf/*.yaml and conf/paper/*.yaml from the config dataclasses (one source of truth: every
field, its default for that recipe, and its doc as a comment). Run: python scripts/make_configs.py
(`--out DIR` writes the same files under DIR instead of conf/, e.g. to compare them with the committed ones)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ragen_lit.config import load_config, render_yaml

CONF = Path(__file__).resolve().parents[1] / "conf"

# The CPU recipes use the embedded tiny model; the overrides are what differs from the dataclass
# defaults (which follow the paper: 8 groups x 16 rollouts, PPO, linear top-p 0.9).
# GRPO (no critic) with 16 prompts x 8 rollouts keeps an iteration to ~6 s on 2 idle cores. From
# sweeps over tiny-model builds and seeds (docs/PERFORMANCE.md): 16 prompts learned faster and more
# steadily than 8 or 32 per iteration, and actor lr 5e-4 more than 3e-4 or 7e-4 (1e-3 drifts).
TINY_CPU = [
    "algo=grpo",
    "rollout.groups=16",
    "rollout.group_size=8",
    "optim.actor_lr=5e-4",
    "trainer.threads=2",
    "trainer.iterations=40",
]
RECIPES = {
    "frozenlake": (
        "FrozenLake 4x4 (deterministic; tiles frozen w.p. 0.8, the reference's 0.9 is in conf/paper/), "
        "GRPO + SNR-aware filtering, tiny model on CPU (paper scale: conf/paper/frozenlake_ppo.yaml)",
        [
            "env.name=frozenlake",
            "env.options={size: 4, p: 0.8, success_rate: 1.0}",
            *TINY_CPU,
            # measured over 12 seeds on two CPU makes (docs/DEFAULT_RECIPE.md): 50 iterations gain >= 10
            # points and end within 3 of their best in 12 of 12 runs (Intel) and 11 of 12 (AMD); 1024 maps
            # every 10 iterations keep the validation noise (binomial sd ~1.5 points) well below the 3-point
            # bar (with 512 maps, 3 of 12 AMD runs read 3-7 points below their best at the end)
            "trainer.iterations=50",
            "validation.num_envs=1024",
            "validation.every_n_iterations=10",
        ],
    ),
    "frozenlake_slippery": (
        "FrozenLake 4x4 (tiles frozen w.p. 0.8) with slip: the intended move succeeds w.p. success_rate "
        "(sweep: env.options.success_rate=0.5 ...)",
        ["env.name=frozenlake", "env.options={size: 4, p: 0.8, success_rate: 0.8}", *TINY_CPU],
    ),
    "sokoban": (
        "Sokoban 6x6, one box, at most 10 actions; GRPO + SNR-aware filtering",
        ["env.name=sokoban", "env.options={size: 6, num_boxes: 1}", *TINY_CPU],
    ),
    "countdown": (
        "Countdown (single turn: one arithmetic expression; generated instances, or Countdown-Tasks records with "
        "env.options.path=FILE.jsonl/.parquet), GRPO + SNR-aware filtering",
        ["env.name=countdown", "rollout.max_turns=1", "rollout.max_actions_per_turn=1", *TINY_CPU],
    ),
    "metamathqa": (
        "MetaMathQA-style QA (single turn; bundled synthetic set, or MetaMathQA records with "
        "env.options.path=FILE.jsonl/.json/.parquet)",
        ["env.name=mathqa", "rollout.max_turns=1", "rollout.max_actions_per_turn=1", *TINY_CPU],
    ),
    "coding": (
        "Coding (DeepCoder-style): a Python program run in a sandbox against hidden tests, reward = fraction "
        "passed; two attempts, the second sees the failed tests (bundled generated set, or "
        "env.options.path=FILE.jsonl/.parquet in DeepCoder/TACO/LiveCodeBench shape)",
        [
            "env.name=coding",
            "env.options={max_attempts: 2}",
            "rollout.max_turns=2",
            "rollout.max_actions_per_turn=1",
            "rollout.max_new_tokens=256",
            *TINY_CPU,
        ],
    ),
    "search_qa": (
        "SearchQA-style: search[query] over a BM25 index, then answer[text] (bundled generated 1-3 hop set, or "
        "env.options.path=QUESTIONS.jsonl corpus_path=CORPUS.jsonl); up to 3 searches, one action per turn",
        [
            "env.name=search_qa",
            "env.options={max_searches: 3, top_k: 3, passage_max_chars: 200, reward: f1}",
            "rollout.max_turns=4",
            "rollout.max_actions_per_turn=1",
            *TINY_CPU,
        ],
    ),
    # WebShop pages are long for the tiny model's 2048-token window: 6 turns of search, click, options and buy
    # (the scripted expert needs 3-5) still fit it.
    "webshop": (
        "WebShop (lite): search, click and buy on the bundled generated catalog (env.options.path=FILE.json for "
        "another); WebShop's reward (type, attribute, option and price match), GRPO + SNR-aware filtering",
        ["env.name=webshop", "rollout.max_turns=6", *TINY_CPU],
    ),
}


# Paper-scale recipes (conf/paper/): RAGEN-2's main-table settings, from the paper and the reference implementation's
# defaults (docs/METHOD.md §7). Settings neither states keep the dataclass defaults.
PAPER_MODEL = "Qwen/Qwen2.5-3B-Instruct"
PAPER = [
    "model.name=hf",
    f"model.path={PAPER_MODEL}",
    # float32 weights, bf16 compute: at lr 1e-6 an AdamW step on bfloat16 weights rounds away (models/precision.py
    # measures it: 99.6% of SmolLM2-135M's weights would not move); vLLM holds a bfloat16 copy the sync casts into
    "model.dtype=float32",
    "trainer.precision=bf16-mixed",
    "rollout.dtype=bfloat16",
    # 8 prompts x 16 rollouts; vLLM at 30% of the GPU; 400 tokens per turn, 3600 in context; T 1.0
    "rollout.engine=vllm",
    "rollout.gpu_memory_utilization=0.3",
    "rollout.groups=8",
    "rollout.group_size=16",
    "rollout.max_new_tokens=400",
    "rollout.max_context_tokens=3600",
    "rollout.temperature=1.0",
    # 512 fixed validation instances at T 0.5, every 10 iterations (reference test_freq 10)
    "validation.num_envs=512",
    "validation.temperature=0.5",
    "validation.every_n_iterations=10",
    # SNR-aware filtering on (linear top-p 0.9); the no-filter baseline is filter.strategy=none
    "filter.strategy=top_p",
    "filter.value=0.9",
    # actor 1e-6, critic 1e-5; mini-batch 32 of 128 rollouts; micro-batch 4 as in the reference's run scripts
    "optim.actor_lr=1e-6",
    "optim.critic_lr=1e-5",
    "optim.num_minibatches=4",
    "optim.micro_batch_size=4",
    # 400 iterations (release runs); keep a checkpoint every 100 (reference save_freq): a 3B actor + critic
    # with optimizer state is tens of GB per checkpoint, and every checkpoint is kept
    "trainer.iterations=400",
    "trainer.checkpoint_every=100",
]
# after the algo preset: entropy 0.001, KL loss off (kl_coef 0), clip 0.2/0.28, as in the main-table scripts
PAPER_ALGO = ["algo.entropy_coef=0.001", "algo.kl_coef=0.0", "algo.clip_low=0.2", "algo.clip_high=0.28"]
# The paper's DAPO row ran the reference's "DAPO" (GAE + critic + token-mean + clip-higher, no KL, no dynamic
# sampling or length shaping), which is the PPO preset field for field; `algo=dapo` is DAPO as Yu et al. define
# it (src/ragen_lit/choices.py), so the paper's row is the PPO recipe, as its header says.
PAPER_ALGOS = {
    "ppo": "PPO (GAE, critic; also the paper's DAPO row: the reference's DAPO is PPO field for field)",
    "grpo": "GRPO (group-normalised return, no critic)",
}
PAPER_ENVS = {
    "frozenlake": (
        "FrozenLake 4x4, tiles frozen w.p. 0.9, deterministic moves, at most 10 actions in 5 turns",
        ["env.name=frozenlake", "env.options={size: 4, p: 0.9, success_rate: 1.0, max_actions_per_episode: 10}"],
    ),
    "sokoban": (
        "Sokoban 6x6, one box, at most 10 actions in 5 turns",
        ["env.name=sokoban", "env.options={size: 6, num_boxes: 1, search_depth: 300, max_actions_per_episode: 10}"],
    ),
    "countdown": (
        "Countdown, single turn: one expression (instances generated from the seed, 3-4 numbers)",
        ["env.name=countdown", "rollout.max_turns=1", "rollout.max_actions_per_turn=1"],
    ),
    "metamathqa": (
        "MathQA, single turn, one attempt: bundled synthetic set (MetaMathQA itself: env.options.path=FILE.jsonl)",
        ["env.name=mathqa", "rollout.max_turns=1", "rollout.max_actions_per_turn=1", "env.options={max_attempts: 1}"],
    ),
}
PAPER_NEEDS = f"# Needs a GPU and the weights of {PAPER_MODEL} (HF hub, or a local folder: model.path=...)"


# Template collapse (conf/collapse/): the regime where tiny-model runs collapse (docs/REPRODUCTION.md, "Template
# collapse"), as the paper's mechanism predicts: a learning rate four times the recipe's, a format penalty that keeps
# every turn in format (rewards then vary little within a group) and an entropy bonus ten times the default, an
# input-agnostic regulariser that dominates the gradient of low-variance groups. No filter: the cure is
# filter.strategy=top_p. Float32 and the exact engine path on every device, so a CPU and a GPU run compute alike.
COLLAPSE = {
    "sokoban": (
        "Sokoban 6x6, one box: template collapse of the tiny model (no filter; compare filter.strategy=top_p)",
        [
            "env.name=sokoban",
            "env.options={size: 6, num_boxes: 1}",
            *TINY_CPU,
            "filter.strategy=none",
            "optim.actor_lr=2e-3",
            "rollout.format_penalty=-1.0",
            "algo.entropy_coef=0.01",
            "trainer.iterations=50",
            "diagnostics.every_n_iterations=2",
            "validation.every_n_iterations=10",
            "logging.save_rollouts=true",
            "model.dtype=float32",
            "trainer.precision=32-true",
            "trainer.matmul_precision=highest",
            "rollout.exact=true",
            "model.compile=false",
            "optim.micro_batch_size=8",
        ],
    ),
}


def paper_recipes() -> dict[str, tuple[str, list[str]]]:
    """`<env>_<algo>` -> (description, overrides) for every paper environment x algorithm."""
    recipes = {}
    for env, (env_text, env_overrides) in PAPER_ENVS.items():
        for algo, algo_text in PAPER_ALGOS.items():
            description = f"{env_text}\n# {algo_text} + SNR-aware filtering (no-filter baseline: filter.strategy=none)"
            recipes[f"{env}_{algo}"] = (description, [f"algo={algo}", *PAPER_ALGO, *PAPER, *env_overrides])
    return recipes


def write_all(conf: Path) -> list[Path]:
    """Write every recipe under `conf` (conf/<name>.yaml, conf/paper/ and conf/collapse/); returns the files."""
    written = []
    groups = [("", RECIPES, []), ("paper/", paper_recipes(), [PAPER_NEEDS]), ("collapse/", COLLAPSE, [])]
    for prefix, recipes, notes in groups:
        (conf / prefix).mkdir(parents=True, exist_ok=True)
        for name, (description, overrides) in recipes.items():
            cfg = load_config(None, overrides)
            header = "\n".join(
                [
                    f"# python -m ragen_lit fit --config conf/{prefix}{name}.yaml",
                    *notes,
                    f"# {description}",
                    "# Regenerate with: python scripts/make_configs.py",
                ]
            )
            path = conf / f"{prefix}{name}.yaml"
            path.write_text(render_yaml(cfg, header))
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=CONF, help="folder to write into (default: conf/)")
    args = parser.parse_args(argv)
    for path in write_all(args.out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
