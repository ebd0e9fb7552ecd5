"""ragen_lit: multi-turn LLM-agent RL on PyTorch Lightning (RAGEN-2: MI collapse diagnostics, SNR-aware filtering)."""

__version__ = "0.1.0"
