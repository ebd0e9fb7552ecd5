"""Rollout engines behind one protocol (`base.Engine`): transformers (`hf`) or vLLM (`vllm`)."""
from __future__ import annotations

from ragen_lit.engines.base import ENGINES, HF_CACHE_MODES, Engine, Generation, SamplingParams

__all__ = ["ENGINES", "HF_CACHE_MODES", "Engine", "Generation", "SamplingParams", "build_engine"]


def build_engine(cfg, module) -> Engine:
    """The engine `rollout.engine` names, bound to `module`'s policy."""
    if cfg.rollout.engine == "hf":
        from ragen_lit.engines.hf import HFEngine

        return HFEngine(
            module.inference_policy(),
            pad_token_id=module.pad_token_id,
            max_batch_size=cfg.rollout.max_batch_size,
            cache=cfg.rollout.hf_cache,
        )
    if cfg.rollout.engine == "vllm":
        from ragen_lit.engines.vllm import VLLMEngine

        return VLLMEngine(
            module.model_path,
            gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
            enable_sleep_mode=cfg.rollout.sleep_mode,
            dtype=cfg.model.dtype,
            max_model_len=cfg.rollout.max_context_tokens,
            seed=cfg.trainer.seed,
        )
    raise ValueError(f"rollout.engine={cfg.rollout.engine!r}; allowed: {', '.join(ENGINES)}")
