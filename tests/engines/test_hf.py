"""Tests for the batched transformers rollout engine (`ragen_lit.engines.hf`)."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention import SDPBackend, sdpa_kernel

from ragen_lit.engines.base import Engine, SamplingParams
from ragen_lit.engines.decode_loops import AllStopped
from ragen_lit.engines.hf import FAST_PATH, HFEngine
from ragen_lit.engines.kept_turns import KeptRows
from ragen_lit.engines.prefill import shared_prefix_plan

# the engine and end-to-end paths CI also runs at the lowest declared dependency versions
pytestmark = pytest.mark.floors

VOCAB = 300
PROMPTS = [[5, 17, 42], [7] * 9, [99], [5, 17, 42], [200, 3, 3, 81, 12], [5, 17, 42], [64, 65]]


def tiny_qwen2(seed: int = 0) -> transformers.Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    return transformers.Qwen2ForCausalLM(config).float()


@pytest.fixture(scope="module")
def model() -> transformers.Qwen2ForCausalLM:
    return tiny_qwen2()


def greedy(max_new_tokens: int = 12, **kwargs) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, **kwargs)


def teacher_forced_logprobs(model, prompt: list[int], generated: list[int], temperature: float) -> list[float]:
    """log_softmax(logits / T) of each generated token from one unpadded forward over prompt + generation."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + generated])).logits[0].float()
    scaled = torch.log_softmax(logits[len(prompt) - 1 : -1] / temperature, dim=-1)
    return scaled.gather(-1, torch.tensor(generated)[:, None])[:, 0].tolist()


def fast(**pieces: bool) -> dict[str, bool]:
    """`HFEngine` keywords: the graph cache's whole fast path, less the pieces given as False."""
    return {**dict.fromkeys(FAST_PATH, True), **pieces}


def on_sdpa_math(engine: HFEngine) -> HFEngine:
    """`engine`, each call run under sdpa's math kernel (its graphs captured on it): the CUDA tests' reference for a
    float32 model, whose products are then exact up to summation order."""
    generate = engine.generate

    def generate_on_math(prompts, params):
        with sdpa_kernel(SDPBackend.MATH):
            return generate(prompts, params)

    engine.generate = generate_on_math
    return engine


def first_stop_end(ids: list[int], stop: list[int]) -> int | None:
    """Number of tokens up to and including the first occurrence of `stop` in `ids`, or None."""
    for end in range(len(stop), len(ids) + 1):
        if ids[end - len(stop) : end] == stop:
            return end
    return None


def test_hf_engine_satisfies_the_engine_protocol(model):
    assert isinstance(HFEngine(model, pad_token_id=0), Engine)


@pytest.mark.slow
@pytest.mark.parametrize("cache", ["dynamic", "static", "graph"])
def test_greedy_batched_equals_one_prompt_at_a_time(model, cache):
    # max_batch_size 3 splits the 7 prompts into chunks; duplicates exercise the dedup prefill.
    engine = HFEngine(model, pad_token_id=0, max_batch_size=3, cache=cache)
    batched = engine.generate(PROMPTS, greedy())
    for prompt, generation in zip(PROMPTS, batched):
        alone = engine.generate([prompt], greedy())[0]
        assert generation.token_ids == alone.token_ids
        assert generation.logprobs == pytest.approx(alone.logprobs, abs=1e-5)
        assert generation.finish_reason == "length"


@pytest.mark.parametrize(
    "params",
    [
        greedy(),
        SamplingParams(max_new_tokens=12, temperature=1.0, seed=1),
        SamplingParams(max_new_tokens=12, temperature=0.7, top_k=20, top_p=0.9, seed=2),
    ],
)
@pytest.mark.parametrize("cache", ["dynamic", "graph"])
def test_logprobs_equal_teacher_forced_recomputation(model, params, cache):
    generations = HFEngine(model, pad_token_id=0, cache=cache).generate(PROMPTS, params)
    temperature = params.temperature if params.temperature > 0 else 1.0
    for prompt, generation in zip(PROMPTS, generations):
        expected = teacher_forced_logprobs(model, prompt, generation.token_ids, temperature)
        assert generation.logprobs == pytest.approx(expected, abs=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("max_batch_size", [3, 256])
def test_graph_decoding_samples_what_dynamic_decoding_samples(model, max_batch_size):
    # Same seed, no stop: both loops draw the same uniforms for the same rows, so the fixed-shape
    # loop (padded batch bucket, bucketed static cache, 4D additive mask) must reproduce every token.
    params = SamplingParams(max_new_tokens=40, temperature=1.0, seed=3)
    dynamic = HFEngine(model, pad_token_id=0, max_batch_size=max_batch_size).generate(PROMPTS, params)
    engine = HFEngine(model, pad_token_id=0, max_batch_size=max_batch_size, cache="graph")
    for _ in range(2):  # the second call reuses the slots of the first
        fixed = engine.generate(PROMPTS, params)
        for a, b in zip(dynamic, fixed):
            assert a.token_ids == b.token_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


@pytest.mark.parametrize("architecture", ["qwen3", "llama"])
def test_graph_decoding_matches_dynamic_decoding_on_other_architectures(architecture):
    # Qwen3 (the embedded tiny model: q/k norms, explicit head_dim) and Llama (untied head)
    torch.manual_seed(0)
    shape = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    if architecture == "qwen3":
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**shape, head_dim=16))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape))
    params = SamplingParams(max_new_tokens=20, temperature=1.0, seed=4)
    dynamic = HFEngine(model, pad_token_id=0).generate(PROMPTS, params)
    fixed = HFEngine(model, pad_token_id=0, cache="graph").generate(PROMPTS, params)
    for a, b in zip(dynamic, fixed):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_graph_decoding_slots_are_bucketed_and_bounded():
    from ragen_lit.engines import decode_graphs

    assert [decode_graphs.batch_bucket(b, 256) for b in (1, 8, 9, 100, 128, 129, 256)] == [8, 8, 16, 128, 128, 256, 256]
    assert decode_graphs.batch_bucket(100, 100) == 100  # never above the engine's chunk size
    assert decode_graphs.batch_bucket(3, 3) == 3
    assert [decode_graphs.length_bucket(n) for n in (1, 256, 257, 1100)] == [256, 256, 512, 1280]
    model = tiny_qwen2()
    graphs = decode_graphs.DecodeGraphs(model, max_batch_size=256)
    first = graphs.slot(5, 100, torch.device("cpu"))
    assert (first.batch_size, first.length) == (8, 256)
    assert graphs.slot(8, 200, torch.device("cpu")) is first
    for length in range(300, 300 + 256 * decode_graphs._MAX_SLOTS, 256):
        graphs.slot(5, length, torch.device("cpu"))
    assert len(graphs._slots) == decode_graphs._MAX_SLOTS and first not in graphs._slots.values()
    kept = graphs.slot(5, 300, torch.device("cpu"))
    assert graphs.slot(5, 300, torch.device("cpu")) is kept
    model.to(torch.float64)  # new parameter tensors: graphs captured on the old ones must go
    fresh = graphs.slot(5, 300, torch.device("cpu"))
    assert fresh is not kept and list(graphs._slots.values()) == [fresh]


def test_sync_keeps_the_graphs_of_the_same_model_and_drops_another_models():
    model = tiny_qwen2()
    engine = HFEngine(model, pad_token_id=0, cache="graph")
    engine.generate(PROMPTS, greedy(3))
    graphs = engine._graphs
    engine.sync(model)  # the rollout loop does this before every call
    assert engine._graphs is graphs and len(graphs._slots) > 0
    engine.sync(tiny_qwen2(seed=1))
    assert engine._graphs is None


def test_graph_slots_stay_within_their_memory_budget():
    from ragen_lit.engines import decode_graphs

    model = tiny_qwen2()
    one = decode_graphs.DecodeGraphs(model, max_batch_size=8).slot(8, 256, torch.device("cpu")).cache_bytes
    # 2 layers x (keys + values) x 8 rows x 2 kv heads x 256 positions x head dim 8 x 4 bytes
    assert one == 2 * 2 * 8 * 2 * 256 * 8 * 4
    graphs = decode_graphs.DecodeGraphs(model, max_batch_size=8, max_cache_bytes=3 * one)
    slots = [graphs.slot(8, 256, torch.device("cpu")), graphs.slot(8, 512, torch.device("cpu"))]  # 1 + 2 units
    assert list(graphs._slots.values()) == slots
    third = graphs.slot(8, 512 + 256, torch.device("cpu"))  # 3 units: both older slots must go
    assert list(graphs._slots.values()) == [third]
    alone = decode_graphs.DecodeGraphs(model, max_batch_size=8, max_cache_bytes=1).slot(8, 256, torch.device("cpu"))
    assert alone.cache_bytes > 1  # the slot in use is kept even beyond the budget


def test_graph_decoding_refuses_models_it_would_mis_mask():
    config = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        use_sliding_window=True,
        sliding_window=16,
        max_window_layers=1,
    )
    sliding = transformers.Qwen2ForCausalLM(config)
    with pytest.raises(ValueError, match="sliding-window"):
        HFEngine(sliding, pad_token_id=0, cache="graph")
    assert HFEngine(sliding, pad_token_id=0, cache="auto").cache_kind(torch.device("cuda")) == "dynamic"


def test_auto_cache_is_graph_on_cuda_and_dynamic_elsewhere(model):
    engine = HFEngine(model, pad_token_id=0, cache="auto")
    assert engine.cache_kind(torch.device("cpu")) == "dynamic"
    assert engine.cache_kind(torch.device("cuda")) == "graph"
    assert HFEngine(model, pad_token_id=0, cache="static").cache_kind(torch.device("cuda")) == "static"


def test_greedy_picks_the_teacher_forced_argmax(model):
    generation = HFEngine(model, pad_token_id=0).generate([PROMPTS[4]], greedy(8))[0]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([PROMPTS[4] + generation.token_ids])).logits[0]
    assert logits[len(PROMPTS[4]) - 1 : -1].argmax(-1).tolist() == generation.token_ids


def test_max_new_tokens_bounds_every_generation(model):
    generations = HFEngine(model, pad_token_id=0).generate(PROMPTS, greedy(5))
    assert [len(g.token_ids) for g in generations] == [5] * len(PROMPTS)
    assert [len(g.logprobs) for g in generations] == [5] * len(PROMPTS)
    assert {g.finish_reason for g in generations} == {"length"}


@pytest.mark.parametrize("cache", ["dynamic", "static", "graph"])
def test_stop_token_ends_generation_right_after_it(model, cache):
    engine = HFEngine(model, pad_token_id=0, cache=cache)
    reference = engine.generate(PROMPTS, greedy(20))
    # Each row stops at its own token 6 (first occurrence), so rows finish at different steps and
    # finished rows are dropped from the batch while the others go on.
    stop_ids = sorted({g.token_ids[5] for g in reference})
    stopped = engine.generate(PROMPTS, greedy(20, stop_token_ids=stop_ids))
    for ref, gen in zip(reference, stopped):
        end = min(ref.token_ids.index(t) + 1 for t in stop_ids if t in ref.token_ids)
        assert gen.token_ids == ref.token_ids[:end]
        assert gen.logprobs == pytest.approx(ref.logprobs[:end], abs=1e-5)
        assert gen.finish_reason == "stop"


def test_stop_sequence_ends_generation_right_after_it(model):
    engine = HFEngine(model, pad_token_id=0)
    reference = engine.generate(PROMPTS, greedy(20))
    stop_sequences = [reference[1].token_ids[3:6], reference[4].token_ids[7:9]]
    stopped = engine.generate(PROMPTS, greedy(20, stop_sequences=stop_sequences))
    for ref, gen in zip(reference, stopped):
        ends = [e for e in (first_stop_end(ref.token_ids, s) for s in stop_sequences) if e is not None]
        end = min(ends, default=20)
        assert gen.token_ids == ref.token_ids[:end]
        assert gen.finish_reason == ("stop" if ends else "length")
    assert stopped[1].token_ids[-3:] == stop_sequences[0]


def test_stop_sequence_does_not_match_across_the_prompt(model):
    engine = HFEngine(model, pad_token_id=0)
    prompt = PROMPTS[4]
    reference = engine.generate([prompt], greedy(10))[0]
    spanning = [prompt[-1], reference.token_ids[0]]
    assert first_stop_end(reference.token_ids, spanning) is None
    generation = engine.generate([prompt], greedy(10, stop_sequences=[spanning]))[0]
    assert generation.token_ids == reference.token_ids
    assert generation.finish_reason == "length"


def test_same_seed_reproduces_and_other_seed_differs(model):
    engine = HFEngine(model, pad_token_id=0, max_batch_size=4)
    params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=123)
    first = engine.generate(PROMPTS, params)
    again = engine.generate(PROMPTS, params)
    other = engine.generate(PROMPTS, SamplingParams(max_new_tokens=10, temperature=1.0, seed=124))
    assert [g.token_ids for g in first] == [g.token_ids for g in again]
    assert [g.logprobs for g in first] == [g.logprobs for g in again]
    assert [g.token_ids for g in first] != [g.token_ids for g in other]


@pytest.mark.slow
@pytest.mark.parametrize(
    "params",
    [greedy(15), SamplingParams(max_new_tokens=15, temperature=1.0, top_p=0.95, seed=7, stop_token_ids=[11, 12, 13])],
)
@pytest.mark.parametrize("cache", ["dynamic", "static", "graph"])
def test_dedup_prefill_gives_the_same_results(model, params, cache):
    prompts = [PROMPTS[0]] * 5 + [PROMPTS[2]] * 3 + PROMPTS
    with_dedup = HFEngine(model, pad_token_id=0, dedup_prompts=True, cache=cache).generate(prompts, params)
    without = HFEngine(model, pad_token_id=0, dedup_prompts=False, cache=cache).generate(prompts, params)
    assert [g.token_ids for g in with_dedup] == [g.token_ids for g in without]
    assert [g.finish_reason for g in with_dedup] == [g.finish_reason for g in without]
    for a, b in zip(with_dedup, without):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


GROUP_PROMPTS = [[5, 17, 42, 8, 9, 10, 11, 12, 13] + tail for tail in ([1, 2, 3], [4, 5], [6, 7, 8, 9], [1, 2, 4])] + [
    [30, 31, 32, 33, 34, 35] + tail for tail in ([40], [41, 42, 43], [44, 45])
]


def test_shared_prefix_prefill_gives_the_plain_prefill_logits(model):
    engine = HFEngine(model, pad_token_id=0, cache="graph", share_prefixes=True)
    plan = shared_prefix_plan(GROUP_PROMPTS)
    assert len(plan.prefixes) == 2  # the chunk takes the two-forward path
    with torch.no_grad():
        shared_logits, _, mask, copy_index = engine._prefill(GROUP_PROMPTS, 4, torch.device("cpu"), share=True)
        plain_logits, *_ = HFEngine(model, pad_token_id=0, cache="graph", dedup_prompts=False)._prefill(
            GROUP_PROMPTS, 4, torch.device("cpu")
        )
    assert copy_index is None  # the cache has a row per prompt already
    assert mask.sum(-1).tolist() == [len(p) for p in GROUP_PROMPTS]
    torch.testing.assert_close(shared_logits, plain_logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "params",
    [greedy(10), SamplingParams(max_new_tokens=10, temperature=1.0, top_p=0.95, seed=3, stop_token_ids=[11, 12])],
)
def test_shared_prefix_prefill_samples_what_the_plain_prefill_samples(model, params):
    # same logits up to rounding and the same random draws per row: the same tokens (a draw would have to
    # land within rounding of a cumulative-probability boundary to differ)
    shared = HFEngine(model, pad_token_id=0, cache="graph", share_prefixes=True).generate(GROUP_PROMPTS, params)
    plain = HFEngine(model, pad_token_id=0, cache="graph", dedup_prompts=False).generate(GROUP_PROMPTS, params)
    assert [g.token_ids for g in shared] == [g.token_ids for g in plain]
    for a, b in zip(shared, plain):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_one_step_samples_follow_the_model_distribution():
    # Sharpen the head so the distribution is far from uniform; rare tokens share one chi-square cell.
    peaked = tiny_qwen2(seed=3)
    with torch.no_grad():
        peaked.lm_head.weight.mul_(40.0)
    prompt = [1, 2, 3, 4]
    with torch.no_grad():
        probs = torch.softmax(peaked(input_ids=torch.tensor([prompt])).logits[0, -1], dim=-1)
    num_samples = 6000
    generations = HFEngine(peaked, pad_token_id=0, max_batch_size=2000).generate(
        [prompt] * num_samples, SamplingParams(max_new_tokens=1, temperature=1.0, seed=0)
    )
    counts = torch.bincount(torch.tensor([g.token_ids[0] for g in generations]), minlength=VOCAB).double()
    expected = probs.double() * num_samples
    common = expected >= 5
    observed_cells = torch.cat([counts[common], counts[~common].sum()[None]])
    expected_cells = torch.cat([expected[common], expected[~common].sum()[None]])
    chi_square = float(((observed_cells - expected_cells) ** 2 / expected_cells).sum())
    dof = len(observed_cells) - 1
    assert expected[common].sum() > 0.5 * num_samples
    assert chi_square < dof + 6 * math.sqrt(2 * dof)


@settings(max_examples=5, deadline=None)
@given(st.permutations(list(range(5))), st.integers(0, 2**31 - 1))
def test_results_follow_their_prompts_under_reordering(model, order, seed):
    # Distinct prompts: identical ones are interchangeable, so only their multiset of results is fixed.
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[4], PROMPTS[6]]
    engine = HFEngine(model, pad_token_id=0, max_batch_size=3)
    params = SamplingParams(max_new_tokens=4, temperature=1.0, seed=seed)
    baseline = engine.generate(prompts, params)
    shuffled = engine.generate([prompts[i] for i in order], params)
    assert [g.token_ids for g in shuffled] == [baseline[i].token_ids for i in order]


def test_training_modes_are_restored(model):
    model.train()
    model.model.layers[0].eval()
    HFEngine(model, pad_token_id=0).generate(PROMPTS[:2], greedy(3))
    assert model.training and model.lm_head.training
    assert not model.model.layers[0].training and not model.model.layers[0].mlp.training
    model.eval()
    HFEngine(model, pad_token_id=0).generate(PROMPTS[:2], greedy(3))
    assert not any(m.training for m in model.modules())


def test_sync_switches_the_sampled_model(model):
    other = tiny_qwen2(seed=1)
    engine = HFEngine(model, pad_token_id=0)
    before = engine.generate(PROMPTS, greedy(6))
    engine.sync(other)
    after = engine.generate(PROMPTS, greedy(6))
    assert after == HFEngine(other, pad_token_id=0).generate(PROMPTS, greedy(6))
    assert after != before


class _FailingModel(torch.nn.Module):
    """Raises `error` from every forward."""

    def __init__(self, inner: torch.nn.Module, error: Exception) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config
        self.error = error

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.inner.get_input_embeddings()

    def forward(self, **kwargs):
        raise self.error


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory"),
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"),
    ],
)
def test_out_of_memory_names_the_batch_size_and_the_knob(model, error):
    engine = HFEngine(_FailingModel(model, error), pad_token_id=0, max_batch_size=4)
    with pytest.raises(RuntimeError, match=r"batch of 4 sequences.*rollout\.max_batch_size") as caught:
        engine.generate(PROMPTS, greedy(3))
    assert caught.value.__cause__ is error


def test_other_runtime_errors_pass_through(model):
    error = RuntimeError("shape mismatch")
    with pytest.raises(RuntimeError, match="shape mismatch"):
        HFEngine(_FailingModel(model, error), pad_token_id=0).generate(PROMPTS, greedy(3))


@pytest.mark.parametrize(
    ("params", "match"),
    [
        (SamplingParams(max_new_tokens=0), "max_new_tokens"),
        (SamplingParams(temperature=-0.1), "temperature"),
        (SamplingParams(temperature=float("nan")), "temperature"),
        (SamplingParams(top_p=0.0), "top_p"),
        (SamplingParams(top_k=-1), "top_k"),
        (SamplingParams(stop_sequences=[[]]), "stop_sequences"),
    ],
)
def test_bad_sampling_params_raise(model, params, match):
    with pytest.raises(ValueError, match=match):
        HFEngine(model, pad_token_id=0).generate(PROMPTS, params)


def test_bad_prompts_and_arguments_raise(model):
    engine = HFEngine(model, pad_token_id=0)
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([[1, 2], []], greedy())
    with pytest.raises(ValueError, match=r"\[0, 300\)"):
        engine.generate([[1, VOCAB]], greedy())
    with pytest.raises(ValueError, match=r"\[0, 300\)"):
        engine.generate([[3, 4], [-1, 2]], greedy())
    with pytest.raises(ValueError, match="pad_token_id must be below the vocabulary size 300"):
        HFEngine(model, pad_token_id=VOCAB).generate(PROMPTS, greedy())
    with pytest.raises(ValueError, match="cache"):
        HFEngine(model, pad_token_id=0, cache="paged")
    with pytest.raises(ValueError, match="max_batch_size"):
        HFEngine(model, pad_token_id=0, max_batch_size=0)
    with pytest.raises(ValueError, match="pad_token_id"):
        HFEngine(model, pad_token_id=-1)
    with pytest.raises(TypeError, match=r"torch\.nn\.Module"):
        engine.sync("not a model")
    assert engine.generate([], greedy()) == []


class _PastKeyValuesModel(torch.nn.Module):
    """`inner` as transformers before 5.24 shaped a causal LM: the KV cache comes as `past_key_values=`,
    and an unknown keyword (such as `cache=`) disappears into `**kwargs`."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config
        self.inner_keyword = "cache" if "cache" in inspect.signature(inner.forward).parameters else "past_key_values"

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.inner.get_input_embeddings()

    def forward(
        self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, use_cache=None, **kwargs
    ):
        return self.inner(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=use_cache,
            logits_to_keep=kwargs.get("logits_to_keep", 0),
            **{self.inner_keyword: past_key_values},
        )


@pytest.mark.parametrize("cache", ["dynamic", "static", "graph"])
def test_a_model_that_takes_past_key_values_decodes_with_its_cache(model, cache):
    # transformers 5.0-5.23 name the cache keyword `past_key_values`; an engine that passed `cache=`
    # decoded every token after the prompt without its context (the tiny model validated at 0.000).
    params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=3)
    expected = HFEngine(model, pad_token_id=0, cache=cache).generate(PROMPTS, params)
    older = HFEngine(_PastKeyValuesModel(model), pad_token_id=0, cache=cache).generate(PROMPTS, params)
    assert [g.token_ids for g in older] == [g.token_ids for g in expected]


class _CacheIgnoringModel(_PastKeyValuesModel):
    """Takes a `cache=` keyword and drops it: the inner model builds a cache of its own."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, use_cache=None, **kwargs):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True)


def test_a_model_that_leaves_the_cache_empty_stops_the_engine(model):
    with pytest.raises(RuntimeError, match=r"_CacheIgnoringModel did not fill the KV cache passed as cache="):
        HFEngine(_CacheIgnoringModel(model), pad_token_id=0).generate(PROMPTS[:2], greedy(3))


@pytest.mark.parametrize("exact", [False, True])
def test_rollout_exact_switches_the_graph_caches_fast_path_as_a_whole(model, exact):
    from ragen_lit.config import load_config
    from ragen_lit.engines import build_engine

    cfg = load_config(None, [f"rollout.exact={str(exact).lower()}"])
    engine = build_engine(cfg.rollout, cfg.model, policy=model, model_path="unused", pad_token_id=0, seed=0)
    assert {name: getattr(engine, name) for name in FAST_PATH} == dict.fromkeys(FAST_PATH, not exact)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_the_fast_path_leaves_the_dynamic_and_static_caches_bit_for_bit_as_they_are(model, cache):
    """The CPU default (cache "auto" is "dynamic" there) samples what it always sampled, fast path or not."""
    params = SamplingParams(max_new_tokens=10, temperature=1.0, top_p=0.95, seed=3, stop_token_ids=[11, 12])
    prompts = GROUP_PROMPTS + PROMPTS
    got = HFEngine(model, pad_token_id=0, cache=cache, **fast()).generate(prompts, params)
    want = HFEngine(model, pad_token_id=0, cache=cache).generate(prompts, params)
    assert [(g.token_ids, g.logprobs) for g in got] == [(g.token_ids, g.logprobs) for g in want]


def _cast_parameters(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """What loading `model`'s weights in `dtype` gives: floating parameters cast, buffers as they are."""
    import copy

    cast = copy.deepcopy(model)
    for p in cast.parameters():
        p.data = p.data.to(dtype)
    return cast


@pytest.mark.parametrize("cache", ["dynamic", "graph"])
def test_a_dtype_copy_samples_what_the_model_in_that_dtype_samples(cache):
    model = tiny_qwen2()
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=3)
    engine = HFEngine(model, pad_token_id=0, cache=cache, dtype=torch.bfloat16)
    got = engine.generate(PROMPTS, params)
    reference = _cast_parameters(model, torch.bfloat16)
    assert got == HFEngine(reference, pad_token_id=0, cache=cache).generate(PROMPTS, params)
    assert got != HFEngine(model, pad_token_id=0, cache=cache).generate(PROMPTS, params)  # not float32 decoding
    assert engine.model is not model and {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # the trainer's weights are untouched
    rotary = [b for name, b in engine.model.named_buffers() if "inv_freq" in name]
    assert rotary and all(b.dtype == torch.float32 for b in rotary)


def test_a_dtype_copy_follows_the_weights_at_every_sync_in_place():
    model = tiny_qwen2()
    engine = HFEngine(model, pad_token_id=0, cache="graph", dtype=torch.bfloat16)
    before = engine.generate(PROMPTS, greedy(6))
    twin, graphs = engine.model, engine._graphs
    with torch.no_grad():  # an optimizer step
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    engine.sync(model)
    assert engine.model is twin and engine._graphs is graphs  # copied in place: the captured graphs stay valid
    after = engine.generate(PROMPTS, greedy(6))
    reference = HFEngine(_cast_parameters(model, torch.bfloat16), pad_token_id=0, cache="graph")
    assert after == reference.generate(PROMPTS, greedy(6))
    assert after != before


def test_a_dtype_copy_keeps_ties_and_copies_no_gradients():
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True,
    )  # fmt: skip
    model = transformers.Qwen2ForCausalLM(config).float()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    twin = HFEngine(model, pad_token_id=0, dtype=torch.bfloat16).model
    assert twin.lm_head.weight is twin.model.embed_tokens.weight
    assert all(p.grad is None and not p.requires_grad for p in twin.parameters())
    assert all(p.grad is not None and p.requires_grad for p in model.parameters())  # the trainer's are kept


def test_a_dtype_the_model_already_has_decodes_with_the_model_itself(model):
    assert HFEngine(model, pad_token_id=0, dtype=torch.float32).model is model
    with pytest.raises(ValueError, match="dtype must be a floating torch.dtype or None, got torch.int64"):
        HFEngine(model, pad_token_id=0, dtype=torch.int64)


@pytest.mark.parametrize(("overrides", "expected"), [([], None), (["rollout.dtype=bfloat16"], torch.bfloat16)])
def test_the_config_sets_the_engine_dtype(model, overrides, expected):
    from ragen_lit.config import load_config
    from ragen_lit.engines import build_engine

    cfg = load_config(None, overrides)
    engine = build_engine(cfg.rollout, cfg.model, policy=model, model_path="unused", pad_token_id=0, seed=0)
    assert engine.dtype is expected


def test_split_attention_samples_what_sdpa_samples(model):
    """The same attention on flash-decoding's kernels; on a CPU, where Triton does not run, the steps keep sdpa."""
    params = SamplingParams(max_new_tokens=10, temperature=1.0, top_p=0.95, seed=3, stop_token_ids=[11, 12])
    want = HFEngine(model, pad_token_id=0, cache="graph").generate(PROMPTS, params)
    got = HFEngine(model, pad_token_id=0, cache="graph", split_attention=True).generate(PROMPTS, params)
    assert [g.token_ids for g in got] == [g.token_ids for g in want]
    for a, b in zip(got, want):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("compile_decode", [False, True], ids=["eager-step", "compiled-step"])
def test_fused_projections_sample_what_separate_ones_sample_after_every_weight_change(compile_decode):
    """`fuse_projections`: q|k|v and gate|up as one product each, from copies written again at every call, so an
    optimizer step between two calls is seen by the second."""
    model = tiny_qwen2()
    params = SamplingParams(max_new_tokens=10, temperature=1.0, top_p=0.95, seed=3, stop_token_ids=[11, 12])
    fused = HFEngine(model, pad_token_id=0, cache="graph", fuse_projections=True, compile_decode=compile_decode)
    for _ in range(2):
        want = HFEngine(model, pad_token_id=0, cache="graph").generate(PROMPTS, params)
        got = fused.generate(PROMPTS, params)
        assert [g.token_ids for g in got] == [g.token_ids for g in want]
        for a, b in zip(got, want):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.5 * torch.randn_like(parameter))
    assert fused._graphs.fused is not None and len(fused._graphs.fused) == 4


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory and events need CUDA")
def test_the_finished_check_on_a_gpu_answers_from_the_check_before_and_decodes_what_the_dynamic_cache_does():
    check = AllStopped(torch.device("cuda"))
    done = torch.tensor([True, True], device="cuda")
    assert not check(torch.tensor([True, False], device="cuda"))
    assert not check(done)  # the previous check's answer
    assert check(done)
    # rows that all stop early: the loop runs on a few steps more, whose tokens are discarded
    model = tiny_qwen2().cuda()
    # greedy: the dynamic cache drops stopped rows, so a sampled draw would differ by the rows left
    params = greedy(60, stop_token_ids=list(range(0, VOCAB, 5)))
    want = HFEngine(model, pad_token_id=0, cache="dynamic").generate(PROMPTS, params)
    got = on_sdpa_math(HFEngine(model, pad_token_id=0, cache="graph")).generate(PROMPTS, params)
    assert [g.token_ids for g in got] == [g.token_ids for g in want]
    assert all(g.finish_reason == "stop" for g in got) and max(len(g.token_ids) for g in got) < 30


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the split kernels and the captured graphs need CUDA")
@pytest.mark.parametrize(
    ("compile_decode", "fuse_projections"), [(False, False), (True, False), (False, True)],
    ids=["captured", "compiled-step", "captured-fused"],
)  # fmt: skip
def test_split_decode_attention_on_cuda_samples_what_sdpa_samples(compile_decode, fuse_projections):
    """The Triton kernels inside captured CUDA graphs (and, compiled, as one opaque operator of the traced step; and
    beside fused projections), against sdpa's math kernel: a float32 model, so the products are exact up to
    summation order."""
    model = tiny_qwen2().cuda()
    params = SamplingParams(max_new_tokens=10, temperature=1.0, top_p=0.95, seed=3, stop_token_ids=[11, 12])
    prompts = PROMPTS * 20  # 140 rows: a batch bucket of 256, and padding rows
    want = on_sdpa_math(HFEngine(model, pad_token_id=0, cache="graph")).generate(prompts, params)
    engine = HFEngine(
        model, pad_token_id=0, cache="graph", split_attention=True, compile_decode=compile_decode,
        fuse_projections=fuse_projections,
    )  # fmt: skip
    got = engine.generate(prompts, params)
    assert [g.token_ids for g in got] == [g.token_ids for g in want]
    for a, b in zip(got, want):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


@pytest.mark.parametrize("split", [False, True])
def test_the_decode_attention_context_enters_twice_and_gives_the_setting_back(model, split):
    """A capture enters the kernel's context for every forward (warm-ups, then the graph): each entry is fresh."""
    from ragen_lit.engines.decode_graphs import attention_kernel

    for _ in range(2):
        with attention_kernel(model, split):
            assert model.config._attn_implementation != "sdpa"  # folded sdpa (a CPU has no split kernels)
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.slow
@pytest.mark.parametrize("layers_compiled", [False, True], ids=["eager-layers", "model.compile"])
def test_compiled_decode_steps_sample_what_eager_steps_sample(layers_compiled):
    """`compile_decode`: each graph-cache step is the whole forward through torch.compile (on a CPU it runs
    compiled without a graph); under model.compile the compiled layers are traced as written inside it."""
    from torch._dynamo.utils import counters

    from ragen_lit.models import compile_layers

    model = tiny_qwen2(seed=1).eval()
    if layers_compiled:
        compile_layers(model)
    params = SamplingParams(max_new_tokens=10, temperature=1.0, top_p=0.95, seed=3, stop_token_ids=[11, 12])
    eager = HFEngine(model, pad_token_id=0, cache="graph").generate(PROMPTS, params)
    graphs = counters["stats"]["unique_graphs"]
    compiled = HFEngine(model, pad_token_id=0, cache="graph", compile_decode=True).generate(PROMPTS, params)
    assert counters["stats"]["unique_graphs"] > graphs  # dynamo compiled the step for this model
    assert [g.token_ids for g in compiled] == [g.token_ids for g in eager]
    for a, b in zip(compiled, eager):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def next_turns(prompts, generations, seed: int) -> list[list[int]]:
    """A rollout's next turn: each prompt, its generation as sampled, and a new message of 2-5 tokens."""
    generator = torch.Generator().manual_seed(seed)
    return [
        [*prompt, *generation.token_ids, *torch.randint(1, VOCAB, (int(n),), generator=generator).tolist()]
        for prompt, generation, n in zip(
            prompts, generations, torch.randint(2, 6, (len(prompts),), generator=generator)
        )
    ]


def three_turns_alike(kept: HFEngine, whole: HFEngine, prompts, params, tolerance: float):
    """Three turns of a rollout from `prompts`, each prompt continuing the last one's prompt and generation: the
    engine that keeps its rows (`reuse_turns`) samples the tokens, and the log-probs within `tolerance`, of the one
    that prefills every conversation whole, and turns 2 and 3 continue every kept row. Returns turn 3's generations."""
    continued = []
    original = kept._prefill_kept
    kept._prefill_kept = lambda *args: continued.append(len(args[2])) or original(*args)
    generations = []
    for turn in range(3):
        if turn:
            prompts = next_turns(prompts, generations, seed=turn - 1)
        generations, whole_generations = kept.generate(prompts, params), whole.generate(prompts, params)
        assert [g.token_ids for g in generations] == [g.token_ids for g in whole_generations]
        for x, y in zip(generations, whole_generations):
            assert x.logprobs == pytest.approx(y.logprobs, abs=tolerance)
    assert continued == [len(prompts)] * 2
    return generations


@pytest.mark.slow
@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_new_tokens=8, temperature=1.0, seed=4),
        # stop ids sampled often: rows stop at different steps, so kept rows hold masked steps after their stop
        SamplingParams(max_new_tokens=8, temperature=1.0, seed=5, stop_token_ids=list(range(1, 60))),
    ],
    ids=["to-length", "stops"],
)
@pytest.mark.parametrize("others", [False, True], ids=["", "fused-split"])
def test_kept_turns_sample_what_a_full_prefill_samples(model, share, params, others):
    """`reuse_turns`: three turns of a rollout, each prompt continuing the last one's prompt and generation. The
    engine that keeps its rows prefills only the new tokens, and samples the tokens and log-probs of the engine
    that prefills every conversation whole (also with the fast path's other decode pieces: fused projections, and
    split decoding, which on a CPU keeps sdpa)."""
    options = {"fuse_projections": True, "split_attention": True} if others else {}
    kept = HFEngine(model, pad_token_id=0, cache="graph", share_prefixes=share, reuse_turns=True, **options)
    whole = HFEngine(model, pad_token_id=0, cache="graph", share_prefixes=share)
    a = three_turns_alike(kept, whole, GROUP_PROMPTS, params, tolerance=1e-5)
    if params.stop_token_ids:
        assert len({len(g.token_ids) for g in a}) > 1


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the split kernels and the captured graphs need CUDA")
@pytest.mark.parametrize(
    "pieces",
    [
        {"reuse_turns": True, "split_attention": True},
        {"reuse_turns": True, "split_attention": True, "compile_decode": True},
        fast(),
    ],
    ids=["captured", "compiled-step", "whole-fast-path"],
)
def test_kept_turns_on_cuda_prefilled_in_the_decode_slot_sample_what_a_full_prefill_samples(pieces):
    """On CUDA a kept turn's new tokens run in the decode slot (sdpa over the bucket under a `[B, 1, S, L]` bias),
    its steps through the split kernels (compiled, and with the whole fast path: shared prefixes and fused
    projections too): three turns of 140 rows (a bucket of 256, with padding rows) against the exact path,
    decoding with sdpa's math kernel. A float32 model, so the products are exact up to summation order."""
    model = tiny_qwen2().cuda()
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=5, stop_token_ids=list(range(1, 60)))
    kept = HFEngine(model, pad_token_id=0, cache="graph", **pieces)
    whole = on_sdpa_math(HFEngine(model, pad_token_id=0, cache="graph"))
    three_turns_alike(kept, whole, GROUP_PROMPTS * 20, params, tolerance=1e-4)


def test_kept_rows_prefill_only_the_new_tokens(model):
    engine = HFEngine(model, pad_token_id=0, cache="graph", reuse_turns=True)
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=6)
    generations = engine.generate(GROUP_PROMPTS, params)
    following = next_turns(GROUP_PROMPTS, generations, seed=0)
    widths = []
    hook = engine.model.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape), with_kwargs=True
    )
    try:
        engine.generate(following, params)
    finally:
        hook.remove()
    # the prefill, in the decode slot (its 8 rows: the 7 and a padding row): the new tokens only; each generation
    # ran to length, and its last sampled token was never fed to the model, so that token and the message (2-5
    # tokens) are new; then one-token decode steps
    messages = [len(f) - len(p) - len(g.token_ids) for f, p, g in zip(following, GROUP_PROMPTS, generations)]
    assert widths[0] == (8, 1 + max(messages))
    assert len(widths) > 1 and all(shape[1] == 1 for shape in widths[1:])


def test_kept_rows_are_dropped_at_sync_release_and_for_prompts_that_do_not_continue_them(model):
    engine = HFEngine(model, pad_token_id=0, cache="graph", reuse_turns=True)
    params = SamplingParams(max_new_tokens=4, temperature=1.0, seed=7)
    continued = []
    original = engine._prefill_kept
    engine._prefill_kept = lambda *args: continued.append(1) or original(*args)
    generations = engine.generate(GROUP_PROMPTS, params)
    following = next_turns(GROUP_PROMPTS, generations, seed=1)
    engine.sync(model)  # new weights may have arrived: the kept rows are stale
    engine.generate(following, params)
    engine.release()
    engine.generate(following, params)
    assert continued == []
    # one prompt that continues no kept row: the whole call prefills as usual
    generations = engine.generate(GROUP_PROMPTS, params)
    following = next_turns(GROUP_PROMPTS, generations, seed=2)
    engine.generate([*following[:-1], [1, 2, 3, 4]], params)
    assert continued == []
    engine.generate(GROUP_PROMPTS, params)
    assert continued == []  # the kept rows were the last call's; these prompts start the conversations afresh


def test_kept_rows_are_found_by_length_and_last_tokens():
    """Row keys by hand (`_KEY_TOKENS` = 8): the last 8 tokens of prompt + generation, from either or both."""
    prompts, generations = [[1, 2, 3], [4] * 10, [5]], [[7, 8], [], [6] * 9]
    mask = torch.ones(3, 10, dtype=torch.bool)
    kept = KeptRows(None, prompts, generations, mask, mask.sum(-1), fed=9)
    assert kept._index == {(5, (1, 2, 3, 7, 8)): [0], (10, (4,) * 8): [1], (10, (6,) * 8): [2]}
    assert kept.continued([[5, *[6] * 9, 2], [1, 2, 3, 7, 8, 9], [4] * 11]) == [2, 0, 1]
    assert kept.continued([[1, 2, 3, 7, 8]]) is None  # continues by no token
    assert kept.continued([[9, 9, *[4] * 8, 1]]) is None  # row 1's key, another prompt


def test_a_kept_turn_checks_its_new_ids_against_the_vocabulary(model):
    engine = HFEngine(model, pad_token_id=0, cache="graph", reuse_turns=True)
    params = SamplingParams(max_new_tokens=4, temperature=1.0, seed=8)
    generations = engine.generate(GROUP_PROMPTS, params)
    following = next_turns(GROUP_PROMPTS, generations, seed=3)
    with pytest.raises(ValueError, match=r"\[0, 300\)"):
        engine.generate([*following[:-1], [*following[-1], VOCAB]], params)
