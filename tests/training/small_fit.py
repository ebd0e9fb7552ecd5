"""The overrides of the CLI tests' smallest fit: two prompts of four rollouts, two short turns, one thread."""

from pathlib import Path

CONFIG = str(Path(__file__).resolve().parents[2] / "conf" / "frozenlake.yaml")
SMALL = [
    "rollout.groups=2",
    "rollout.group_size=4",
    "rollout.max_turns=2",
    "rollout.max_new_tokens=32",
    "validation.num_envs=4",
    "diagnostics.num_samples=8",
    "optim.micro_batch_size=8",
    "trainer.threads=1",
]
