"""ragen_lit: multi-turn LLM-agent RL on PyTorch Lightning (RAGEN-2: MI collapse diagnostics, SNR-aware filtering)."""

# Importing the envs registers them with gymnasium, so `import ragen_lit` alone is enough for
# `gymnasium.make("ragen_lit/FrozenLake-v0")`; the package imports nothing heavier (no torch).
import ragen_lit.envs  # noqa: F401

__version__ = "0.1.0"
