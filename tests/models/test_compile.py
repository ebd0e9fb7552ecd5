"""`model.compile`: compiled decoder layers and head give the eager log-probs and gradients."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers

from ragen_lit.config import ConfigError
from ragen_lit.logprobs import token_logprobs
from ragen_lit.models import compile_layers


def tiny_qwen2() -> transformers.Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return transformers.Qwen2ForCausalLM(config)


def logprobs_and_grads(model, length: int, compile_head: bool):
    generator = torch.Generator().manual_seed(length)
    input_ids = torch.randint(0, 300, (3, length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, -4:] = 0  # right padding on one row
    out = token_logprobs(
        model, input_ids, attention_mask, with_entropy=True, compile_head=compile_head, max_tokens_per_chunk=16
    )
    (out.logprobs.sum() + 0.1 * out.entropy.sum()).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return out, grads


def test_compiled_layers_and_head_match_eager_across_lengths():
    eager = tiny_qwen2()
    compiled = copy.deepcopy(eager)
    compile_layers(compiled)
    for length in (12, 29):  # a second length must reuse the dynamic-shape graph, not break it
        want, want_grads = logprobs_and_grads(eager, length, compile_head=False)
        got, got_grads = logprobs_and_grads(compiled, length, compile_head=True)
        torch.testing.assert_close(got.logprobs, want.logprobs, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.entropy, want.entropy, atol=1e-5, rtol=1e-5)
        for g, w in zip(got_grads, want_grads):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


def test_a_copy_of_a_compiled_model_runs_its_own_layers():
    model = tiny_qwen2()
    compile_layers(model)
    clone = copy.deepcopy(model)
    for layer, cloned in zip(model.model.layers, clone.model.layers):
        assert layer.forward.__self__ is layer and cloned.forward.__self__ is cloned
    with torch.no_grad():
        for p in clone.parameters():
            p.zero_()
    with torch.no_grad():
        ids = torch.tensor([[1, 2, 3]])
        assert not torch.equal(model(ids, use_cache=False).logits, clone(ids, use_cache=False).logits)


def test_calls_with_a_kv_cache_run_the_eager_layers(monkeypatch):
    calls = []

    def fake_compile(forward, **options):
        def compiled(*args, **kwargs):
            calls.append(kwargs.get("cache"))
            return forward(*args, **kwargs)

        return compiled

    monkeypatch.setattr(torch, "compile", fake_compile)
    model = tiny_qwen2()
    compile_layers(model)
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        model(ids, use_cache=False)
        assert calls == [None] * 3  # three layers, no cache: the compiled forward
        model(ids, cache=transformers.DynamicCache(config=model.config), use_cache=True)
    assert calls == [None] * 3  # with a cache: eager


def test_models_without_repeated_layers_are_refused():
    with pytest.raises(ConfigError, match="model.compile"):
        compile_layers(torch.nn.Linear(2, 2))


def test_cross_scoring_with_the_compiled_head_matches_the_eager_head(monkeypatch):
    from ragen_lit import logprobs
    from ragen_lit.metrics import cross_score

    compiled, used = logprobs._compiled_head_logprobs, []
    monkeypatch.setattr(logprobs, "_compiled_head_logprobs", lambda: used.append(1) or compiled())

    model = tiny_qwen2().eval()
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(1, 300, (n,), generator=generator).tolist() for n in (9, 14, 4)]
    reasonings = [torch.randint(1, 300, (n,), generator=generator).tolist() for n in (5, 1, 8)]
    for bound in (8192, 12):  # one batch of rows, and many small ones
        want = cross_score(model, prompts, reasonings, max_tokens_per_forward=bound, max_tokens_per_chunk=7)
        got = cross_score(
            model, prompts, reasonings, max_tokens_per_forward=bound, max_tokens_per_chunk=7, compile_head=True
        )
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    assert used  # the compiled head did the scoring
