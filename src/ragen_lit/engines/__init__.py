"""Rollout engines behind one protocol (`base.Engine`): transformers (`hf`) or vLLM (`vllm`)."""

from __future__ import annotations

from torch import nn

from ragen_lit.choices import ENGINES, HF_CACHE_MODES
from ragen_lit.engines.base import Engine, Generation, SamplingParams

__all__ = [
    "ENGINES",
    "HF_CACHE_MODES",
    "Engine",
    "Generation",
    "SamplingParams",
    "build_engine",
]


def build_engine(rollout_cfg, model_cfg, *, policy: nn.Module, model_path: str, pad_token_id: int, seed: int) -> Engine:
    """The engine `rollout_cfg.engine` names (`RolloutConfig`, `ModelConfig` sections of the config), holding the
    weights in `rollout_cfg.dtype` (null: `model_cfg.dtype`): transformers generating with `policy` itself (or with
    a copy of it in `rollout_cfg.dtype`), its graph cache on the fast path unless `rollout_cfg.exact`, or vLLM
    loading the weights at `model_path` (with `rollout_cfg.vllm_args` passed on to `vllm.LLM`); the trainer syncs the
    policy into either before every rollout."""
    if rollout_cfg.engine == "hf":
        from ragen_lit.engines.hf import FAST_PATH, HFEngine
        from ragen_lit.models import DTYPES

        return HFEngine(
            policy,
            pad_token_id=pad_token_id,
            max_batch_size=rollout_cfg.max_batch_size,
            cache=rollout_cfg.hf_cache,
            dtype=None if rollout_cfg.dtype is None else DTYPES[rollout_cfg.dtype],
            **dict.fromkeys(FAST_PATH, not rollout_cfg.exact),
        )
    if rollout_cfg.engine == "vllm":
        from ragen_lit.engines.vllm import VLLMEngine

        return VLLMEngine(
            model_path,
            gpu_memory_utilization=rollout_cfg.gpu_memory_utilization,
            enable_sleep_mode=rollout_cfg.sleep_mode,
            dtype=rollout_cfg.dtype or model_cfg.dtype,
            max_model_len=rollout_cfg.max_context_tokens,
            seed=seed,
            **rollout_cfg.vllm_args,
        )
    raise ValueError(f"rollout.engine={rollout_cfg.engine!r}; allowed: {', '.join(ENGINES)}")
