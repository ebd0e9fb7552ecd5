"""The request checks every engine runs (`validate_request`); the engines' own tests check they call it."""

from __future__ import annotations

import pytest

from ragen_lit.engines.base import SamplingParams, validate_request


def test_prompts_come_back_as_lists():
    assert validate_request([(1, 2), range(3, 5)], SamplingParams()) == [[1, 2], [3, 4]]
    assert validate_request([], SamplingParams()) == []


@pytest.mark.parametrize(
    "params, message",
    [
        (SamplingParams(max_new_tokens=0), "max_new_tokens must be an int >= 1, got 0"),
        (SamplingParams(temperature=float("inf")), "temperature must be finite and >= 0 (0 = greedy), got inf"),
        (SamplingParams(top_p=1.5), "top_p must be in (0, 1], got 1.5"),
        (SamplingParams(top_k=2.0), "top_k must be an int >= 0 (0 disables top-k), got 2.0"),
        (SamplingParams(stop_sequences=[[1], []]), "stop_sequences must be non-empty id sequences, got [[1], []]"),
    ],
)
def test_bad_sampling_params_are_refused_with_the_setting_named(params, message):
    with pytest.raises(ValueError) as error:
        validate_request([[1]], params)
    assert str(error.value) == message


def test_an_empty_prompt_is_refused():
    with pytest.raises(ValueError, match="^every prompt must hold at least one token id; got an empty prompt$"):
        validate_request([[1], []], SamplingParams())


@pytest.mark.parametrize(("overrides", "expected"), [([], "float32"), (["rollout.dtype=bfloat16"], "bfloat16")])
def test_vllm_holds_the_weights_in_rollout_dtype_else_model_dtype(monkeypatch, overrides, expected):
    import ragen_lit.engines.vllm as vllm_module
    from ragen_lit.config import load_config
    from ragen_lit.engines import build_engine

    made = {}
    monkeypatch.setattr(vllm_module, "VLLMEngine", lambda path, **kwargs: made.update(kwargs))
    cfg = load_config(None, ["rollout.engine=vllm", "model.dtype=float32", *overrides])
    build_engine(cfg.rollout, cfg.model, policy=None, model_path="unused", pad_token_id=0, seed=0)
    assert made["dtype"] == expected


def test_vllm_args_reach_vllm_and_override_the_engine_defaults(monkeypatch):
    import ragen_lit.engines.vllm as vllm_module
    from ragen_lit.config import load_config
    from ragen_lit.engines import build_engine

    made = {}
    monkeypatch.setattr(vllm_module, "VLLMEngine", lambda path, **kwargs: made.update(kwargs))
    overrides = ["rollout.engine=vllm", "rollout.vllm_args={enforce_eager: true, kv_cache_memory_bytes: 1073741824}"]
    cfg = load_config(None, overrides)
    build_engine(cfg.rollout, cfg.model, policy=None, model_path="unused", pad_token_id=0, seed=0)
    assert made["enforce_eager"] is True and made["kv_cache_memory_bytes"] == 1 << 30
    assert made["gpu_memory_utilization"] == 0.3  # the engine's own arguments stay
