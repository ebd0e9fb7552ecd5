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


def test_calls_with_a_kv_cache_run_the_eager_layers_with_compiled_norms_and_mlp(monkeypatch):
    calls = []

    def fake_compile(forward, **options):
        def compiled(module, *args, **kwargs):  # a compiled function's first argument is no module
            name = forward.__name__ if forward.__name__ == "apply_rotary_pos_emb" else type(module).__name__
            calls.append((name, kwargs.get("cache")))
            return forward(module, *args, **kwargs)

        return compiled

    monkeypatch.setattr(torch, "compile", fake_compile)
    model = tiny_qwen2()
    compile_layers(model)
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        model(ids, use_cache=False)
        # no cache: the compiled layers (here, eager inside the fake: a real compiled layer traces its parts)
        assert [name for name, _ in calls if name == "Qwen2DecoderLayer"] == ["Qwen2DecoderLayer"] * 3
        calls.clear()
        model(ids, cache=transformers.DynamicCache(config=model.config), use_cache=True)
    # with a cache: each layer eager, its norms (before attention and before the MLP), its attention's rotary
    # embedding and its MLP compiled; the model's final norm is no layer's part
    assert [name for name, _ in calls] == ["Qwen2RMSNorm", "apply_rotary_pos_emb", "Qwen2RMSNorm", "Qwen2MLP"] * 3


@pytest.mark.slow
def test_a_cache_call_rotates_with_the_compiled_rotary_embedding_for_its_attention_only():
    from transformers.models.qwen2 import modeling_qwen2

    original = modeling_qwen2.apply_rotary_pos_emb
    eager = tiny_qwen2()
    model = copy.deepcopy(eager)
    compile_layers(model)
    during = []
    model.model.layers[0].self_attn.q_proj.register_forward_hook(
        lambda *_: during.append(modeling_qwen2.apply_rotary_pos_emb is original)
    )
    ids = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])
    with torch.no_grad():
        want = eager(ids, past_key_values=transformers.DynamicCache(config=eager.config), use_cache=True).logits
        got = model(ids, past_key_values=transformers.DynamicCache(config=model.config), use_cache=True).logits
    assert during == [False]  # switched inside the compiled model's attention call
    assert modeling_qwen2.apply_rotary_pos_emb is original  # and back after it
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_compiled_norms_and_mlp_are_traced_as_written_inside_a_compiled_layer():
    from ragen_lit.models import loaders

    traced = []

    def forward(module, x):
        traced.append(torch.compiler.is_compiling())
        return x + 1

    dispatch = loaders._compiled_outside_compilation(forward)
    outer = torch.compile(lambda x: dispatch(None, x), backend="eager")
    assert torch.equal(outer(torch.zeros(2)), torch.ones(2))
    assert traced and all(traced)  # inside the enclosing compilation: `forward` itself, not the nested compile


def test_models_without_repeated_layers_are_refused():
    with pytest.raises(ConfigError, match="model.compile"):
        compile_layers(torch.nn.Linear(2, 2))


def test_auto_compile_leaves_a_model_without_repeated_layers_eager_and_true_refuses_it():
    """`model.compile=null` resolves to on where a GPU is used; a model it cannot compile then stays eager."""
    from types import SimpleNamespace

    from ragen_lit.config import load_config
    from ragen_lit.training.module import AgentRLModule
    from ragen_lit.training.sections import ModuleSections

    module = SimpleNamespace(
        _configured=False,
        device_mesh=None,
        cfg=ModuleSections.of(load_config(None, [])),
        compiled=True,
        policy=torch.nn.Linear(2, 2),
    )
    AgentRLModule.configure_model(module)  # as on a GPU, with the auto setting
    assert module._configured
    module.cfg.model.compile, module._configured = True, False
    with pytest.raises(ConfigError, match="model.compile"):
        AgentRLModule.configure_model(module)


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


@pytest.mark.parametrize("cache", ["graph", "dynamic"])
def test_rollouts_of_a_compiled_model_match_the_eager_model(cache):
    """The engine's decode (cache="graph": the fixed-shape slots that a GPU captures, run eagerly on CPU) through
    compiled norms and MLPs samples what the eager model samples, with the same log-probs."""
    from ragen_lit.engines.base import SamplingParams
    from ragen_lit.engines.hf import HFEngine

    eager = tiny_qwen2().eval()
    compiled = copy.deepcopy(eager)
    compile_layers(compiled)
    generator = torch.Generator().manual_seed(4)
    prompts = [torch.randint(1, 300, (n,), generator=generator).tolist() for n in (7, 7, 12, 3)]
    params = SamplingParams(max_new_tokens=9, temperature=1.0, seed=5)
    want = HFEngine(eager, pad_token_id=0, cache=cache).generate(prompts, params)
    got = HFEngine(compiled, pad_token_id=0, cache=cache).generate(prompts, params)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    for g, w in zip(got, want):
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-5, rtol=1e-5)
