"""cross_score against a naive per-pair full-logits computation on tiny random models: the shared
prompt-KV-cache path (Qwen2, Qwen3, Llama) and the full-pair fallback (models without a usable cache)."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from ragen_lit.metrics import cross_score, cross_score_scopes, cross_scoring, packed_scoring

# continuing a KV cache; CI also runs these at the lowest declared versions
pytestmark = pytest.mark.floors

VOCAB = 300
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


def tiny_model(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**TINY))
    elif kind == "qwen2-sliding":  # sliding-window layers: their cache is not a plain DynamicLayer
        model = Qwen2ForCausalLM(Qwen2Config(**TINY, use_sliding_window=True, sliding_window=6, max_window_layers=0))
    elif kind == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**TINY, head_dim=8))
    elif kind == "llama-eager":  # eager attention: additive float masks instead of SDPA's boolean ones
        model = LlamaForCausalLM(LlamaConfig(**TINY, attn_implementation="eager"))
    else:
        model = LlamaForCausalLM(LlamaConfig(**TINY))
    return model.float().eval()


def token_lists(lengths: list[int], seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (length,), generator=generator).tolist() for length in lengths]


def naive_sequence_logprob(model, prompt: list[int], reasoning: list[int], temperature: float = 1.0) -> float:
    """Σ_t log p_T(z_t | x, z_<t), p_T = softmax(logits / T), from one unpadded forward with full fp32 logits."""
    ids = torch.tensor([prompt + reasoning])
    with torch.no_grad():
        log_probs = (model(input_ids=ids).logits.float() / temperature).log_softmax(-1)[0]
    positions = torch.arange(len(prompt), len(prompt) + len(reasoning))
    return float(log_probs[positions - 1, ids[0, positions]].sum())


def record_forward(model, forwards: list) -> None:
    """Append `(rows, input length, cached prefix length)` of every backbone forward to `forwards`."""

    def hook(module, args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        rows, length = kwargs["input_ids"].shape
        # int(): a static cache's length is a tensor that the forward then advances in place
        forwards.append((rows, length, int(cache.get_seq_length()) if cache is not None else 0))

    model.get_decoder().register_forward_pre_hook(hook, with_kwargs=True)


def naive_matrix(model, prompts, reasonings) -> torch.Tensor:
    return torch.tensor([[naive_sequence_logprob(model, x, z) for x in prompts] for z in reasonings])


def assert_matches_naive(model, prompts, reasonings, **kwargs) -> None:
    l_tok, l_sum = cross_score(model, prompts, reasonings, **kwargs)
    assert l_tok.shape == l_sum.shape == (len(reasonings), len(prompts)) and l_sum.dtype == torch.float32
    want = naive_matrix(model, prompts, reasonings)
    torch.testing.assert_close(l_sum, want, atol=1e-4, rtol=0)
    lengths = torch.tensor([len(z) for z in reasonings], dtype=torch.float32)
    torch.testing.assert_close(l_tok, want / lengths[:, None], atol=1e-4, rtol=0)


PROMPTS = token_lists([5, 9, 3, 12], seed=1)
REASONINGS = token_lists([4, 1, 7, 10, 2], seed=2)
# duplicates among prompts and reasonings, a one-token prompt (no cached prefix), lengths 1..16
MIXED_PROMPTS = [PROMPTS[1], *token_lists([1, 16], seed=3), PROMPTS[1], PROMPTS[0], PROMPTS[3], PROMPTS[0]]
MIXED_REASONINGS = [*REASONINGS, REASONINGS[2], *token_lists([13, 6], seed=4), REASONINGS[0]]
SIMILAR_PROMPTS = token_lists([13, 12, 10, 12], seed=5)  # prefixes of 12, 11, 9 and 11 tokens


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["varlen", "auto"])
@pytest.mark.parametrize("kind, max_tokens_per_forward", [("qwen2", 8192), ("qwen2", 40), ("llama", 1), ("llama", 25)])
def test_matches_naive_per_pair(kind, max_tokens_per_forward, attention):
    model = tiny_model(kind)
    l_tok, l_sum = cross_score(
        model, PROMPTS, REASONINGS, max_tokens_per_forward=max_tokens_per_forward, pad_token_id=7, attention=attention
    )
    assert l_tok.shape == l_sum.shape == (5, 4) and l_sum.dtype == torch.float32
    want = torch.tensor([[naive_sequence_logprob(model, x, z) for x in PROMPTS] for z in REASONINGS])
    torch.testing.assert_close(l_sum, want, atol=1e-4, rtol=0)
    lengths = torch.tensor([len(z) for z in REASONINGS], dtype=torch.float32)
    torch.testing.assert_close(l_tok, want / lengths[:, None], atol=1e-4, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["varlen", "auto"])
@pytest.mark.parametrize("kind", ["qwen3", "qwen2", "llama", "llama-eager"])
@pytest.mark.parametrize("prompts", [MIXED_PROMPTS, SIMILAR_PROMPTS], ids=["mixed", "similar"])
@pytest.mark.parametrize("max_tokens_per_forward", [8192, 30, 1])
def test_duplicates_and_mixed_lengths_match_naive(kind, prompts, max_tokens_per_forward, attention):
    assert_matches_naive(
        tiny_model(kind),
        prompts,
        MIXED_REASONINGS,
        max_tokens_per_forward=max_tokens_per_forward,
        pad_token_id=3,
        max_tokens_per_chunk=5,
        attention=attention,
    )


def test_each_distinct_prompt_is_encoded_once_and_reasonings_continue_its_cache():
    model = tiny_model("qwen3")
    forwards = []
    record_forward(model, forwards)
    cross_score(model, MIXED_PROMPTS, MIXED_REASONINGS, attention="auto")
    # 5 distinct prompts (16, 12, 9, 5 and 1 tokens; their prefixes too different to share a forward) and
    # 7 distinct reasonings (longest 13): per prompt, its prefix (all but the last token) once, then its
    # 7 rows [last prompt token | reasoning] over that cache; the one-token prompt has no prefix
    assert forwards == [
        (1, 15, 0),
        (7, 14, 15),
        (1, 11, 0),
        (7, 14, 11),
        (1, 8, 0),
        (7, 14, 8),
        (1, 4, 0),
        (7, 14, 4),
        (7, 14, 0),
    ]


def test_prompts_of_similar_length_share_one_prefix_forward_and_batch():
    model = tiny_model("qwen3")
    prompts = [*SIMILAR_PROMPTS, SIMILAR_PROMPTS[1]]
    forwards = []
    record_forward(model, forwards)
    _, l_sum = cross_score(model, prompts, MIXED_REASONINGS, attention="auto")
    reasonings = set(map(tuple, MIXED_REASONINGS))
    # prefixes of 12, 11, 11 and 9 tokens (>= 3/4 of the longest) in one forward, then all 4 x 7 rows in
    # one, the shorter prefixes masked where they are padded to 12
    assert forwards == [(4, 12, 0), (4 * len(reasonings), 1 + max(map(len, reasonings)), 12)]
    torch.testing.assert_close(l_sum, naive_matrix(model, prompts, MIXED_REASONINGS), atol=1e-4, rtol=0)


def test_forwards_and_head_chunks_respect_their_bounds():
    model = tiny_model("qwen2")
    forwards, head_rows = [], []
    record_forward(model, forwards)
    model.get_output_embeddings().register_forward_hook(lambda mod, args, out: head_rows.append(out.shape[0]))
    cross_score(model, SIMILAR_PROMPTS, REASONINGS, max_tokens_per_forward=30, max_tokens_per_chunk=6, attention="auto")
    prefix_forwards = [f for f in forwards if f[2] == 0]
    batches = [f for f in forwards if f[2] > 0]
    # the prefixes (12, 11, 11 and 9 tokens, longest first) in forwards of rows x longest <= 30
    assert prefix_forwards == [(2, 12, 0), (2, 11, 0)]
    # all 20 pairs, rows x (cached prefix + [last prompt token | reasoning]) <= 30 padded tokens
    assert sum(rows for rows, _, _ in batches) == 20
    assert all(rows * (past + length) <= 30 for rows, length, past in batches)
    assert len(batches) > 4 and max(head_rows) <= 6
    assert sum(head_rows) == 4 * sum(len(z) for z in REASONINGS)  # only reasoning tokens reach the head


def test_row_longer_than_the_bound_gets_its_own_forward():
    model = tiny_model("qwen2")
    forwards = []
    record_forward(model, forwards)
    cross_score(model, [[1, 2, 3]], [[4, 5, 6, 7], [8, 9]], max_tokens_per_forward=5, attention="auto")
    assert forwards == [(1, 2, 0), (1, 5, 2), (1, 3, 2)]


@pytest.mark.parametrize("no_cache", ["keyword", "sliding"])
def test_models_without_a_usable_cache_fall_back_to_full_pairs(monkeypatch, no_cache):
    if no_cache == "keyword":  # a decoder that takes no KV cache argument
        model = tiny_model("llama")
        monkeypatch.setattr(cross_scoring, "cache_keyword", lambda model: None)
    else:  # sliding-window layers
        model = tiny_model("qwen2-sliding")
    forwards = []
    record_forward(model, forwards)
    _, l_sum = cross_score(model, MIXED_PROMPTS, MIXED_REASONINGS, max_tokens_per_forward=40, attention="auto")
    if no_cache == "sliding":  # it first encodes the longest prefix (15 tokens), finds the cache unusable
        assert forwards[0] == (1, 15, 0)
        forwards = forwards[1:]
    # then every distinct pair, whole, in forwards without a cache
    distinct = len(set(map(tuple, MIXED_PROMPTS))) * len(set(map(tuple, MIXED_REASONINGS)))
    assert all(past == 0 for _, _, past in forwards) and sum(rows for rows, _, _ in forwards) == distinct
    torch.testing.assert_close(l_sum, naive_matrix(model, MIXED_PROMPTS, MIXED_REASONINGS), atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", ["qwen2", "qwen2-sliding"], ids=["prompt-cache", "full-pairs"])
def test_scores_at_the_given_temperature(kind):
    """L_sum[r, j] = Σ_t log_softmax(logits / T)[z_t] on both scoring paths; at T=0.5 and 2 the
    log-probs differ from T=1 as log_softmax(logits / T) says, not by rounding."""
    model = tiny_model(kind)
    prompts, reasonings = PROMPTS[:3], REASONINGS[:3]
    at_one = cross_score(model, prompts, reasonings)[1]
    for temperature in (0.5, 2.0):
        l_tok, l_sum = cross_score(model, prompts, reasonings, temperature=temperature)
        want = torch.tensor([[naive_sequence_logprob(model, x, z, temperature) for x in prompts] for z in reasonings])
        torch.testing.assert_close(l_sum, want, atol=1e-4, rtol=0)
        assert (l_sum - at_one).abs().max() > 100 * 1e-4  # far beyond the tolerance above


def test_no_grad_and_mode_left_as_is():
    model = tiny_model("llama").train()
    l_tok, l_sum = cross_score(model, PROMPTS[:2], REASONINGS[:2])
    assert model.training and not l_sum.requires_grad and not l_tok.requires_grad
    assert all(p.grad is None for p in model.parameters())


def test_no_reasonings_gives_empty_rows():
    l_tok, l_sum = cross_score(tiny_model("qwen2"), PROMPTS, [])
    assert l_tok.shape == l_sum.shape == (0, 4)


@pytest.mark.parametrize(
    "prompts, reasonings, kwargs, message",
    [
        (PROMPTS, [[1, 2], []], {}, r"reasonings\[1\]"),
        ([[1], []], REASONINGS, {}, r"prompts\[1\]"),
        ([], REASONINGS, {}, "prompts"),
        (PROMPTS, REASONINGS, dict(max_tokens_per_forward=0), "max_tokens_per_forward"),
        (PROMPTS, REASONINGS, dict(attention="flash"), r"attention must be one of \('varlen', 'auto', 'efficient'\)"),
    ],
)
def test_bad_inputs_raise(prompts, reasonings, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cross_score(tiny_model("qwen2"), prompts, reasonings, **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["qwen2", "llama", "llama-eager"])
@pytest.mark.parametrize("max_tokens_per_forward", [8192, 60, 1])
def test_padded_widths_match_naive(kind, max_tokens_per_forward):
    """`pad_widths` (on by default on a GPU): prefixes and rows rounded up to multiples of 64 and 16, masked."""
    assert_matches_naive(
        tiny_model(kind),
        MIXED_PROMPTS,
        MIXED_REASONINGS,
        max_tokens_per_forward=max_tokens_per_forward,
        pad_token_id=3,
        max_tokens_per_chunk=5,
        pad_widths=True,
        attention="auto",
    )


def test_the_efficient_kernel_scores_what_naive_scoring_does_and_is_the_only_fused_one_allowed(monkeypatch):
    """`attention="efficient"` (`diagnostics.attention`): sdpa may use the memory-efficient kernel (or math), not
    cuDNN's, whose plans are built per shape; the scores are unchanged."""
    allowed = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(*args, **kwargs):
        allowed.append((torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled()))
        return sdpa(*args, **kwargs)

    model = tiny_model("qwen2")
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    _, l_sum = cross_score(
        model, MIXED_PROMPTS, MIXED_REASONINGS, max_tokens_per_forward=60, pad_widths=True, attention="efficient"
    )
    monkeypatch.undo()
    assert allowed and all(flags == (False, True) for flags in allowed)
    assert torch.backends.cuda.cudnn_sdp_enabled()  # the setting is back after the call
    torch.testing.assert_close(l_sum, naive_matrix(model, MIXED_PROMPTS, MIXED_REASONINGS), atol=1e-4, rtol=0)


def test_padded_widths_repeat_across_calls_with_new_lengths():
    """Calls whose prompts and reasonings have new lengths run forwards of the same widths when padded."""
    model = tiny_model("qwen2")
    widths = []
    record_forward(model, widths)
    for seed in (10, 11):
        generator = torch.Generator().manual_seed(seed)
        prompts = token_lists(torch.randint(40, 60, (3,), generator=generator).tolist(), seed)
        reasonings = token_lists(torch.randint(5, 14, (4,), generator=generator).tolist(), seed + 1)
        cross_score(model, prompts, reasonings, pad_widths=True, attention="auto")
    assert {(length, cached) for _, length, cached in widths} == {(64, 0), (16, 64)}


def test_grouped_heads_are_scored_without_repeating_keys(monkeypatch):
    """The scorer's masked attention stacks the query heads of a key/value head (`fold_gqa_attention`) and
    leaves the model's attention setting as it found it."""
    from ragen_lit.models import gqa_attention

    model = tiny_model("qwen2")
    calls = []
    fold = gqa_attention.fold_gqa_attention
    monkeypatch.setattr(gqa_attention, "fold_gqa_attention", lambda *a, **k: calls.append(a[0].shape) or fold(*a, **k))
    assert_matches_naive(model, PROMPTS, REASONINGS, attention="auto")
    assert calls and all(shape[1] == TINY["num_attention_heads"] for shape in calls)
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.slow
def test_varlen_packs_each_groups_prefixes_once_and_its_rows_end_to_end():
    """`attention="varlen"`: no padding and no gathered prefixes. The 4 similar prompts' prefixes (12, 11, 11 and 9
    tokens) run as one sequence of 43 tokens; then every (prompt, reasoning) row, `[last prompt token | z]`, packed
    end to end. With a bound of 30 tokens per forward, prefix groups hold 2 prompts (2 x 12 <= 30) and row forwards
    at most 30 real tokens (a single row beyond it on its own)."""
    model = tiny_model("qwen2")
    prompts = [*SIMILAR_PROMPTS, SIMILAR_PROMPTS[1]]
    reasonings = list(map(list, dict.fromkeys(map(tuple, MIXED_REASONINGS))))  # the 7 distinct reasonings
    row_tokens = 4 * sum(1 + len(z) for z in reasonings)
    for bound in (8192, 30):
        forwards = []
        record_forward(model, forwards)
        _, l_sum = cross_score(model, prompts, MIXED_REASONINGS, max_tokens_per_forward=bound)
        model.get_decoder()._forward_pre_hooks.clear()
        torch.testing.assert_close(l_sum, naive_matrix(model, prompts, MIXED_REASONINGS), atol=1e-4, rtol=0)
        assert all(rows == 1 and cached == 0 for rows, _, cached in forwards)
        lengths = [length for _, length, _ in forwards]
        if bound == 8192:
            assert lengths == [43, row_tokens]
        else:
            assert sum(lengths) == 43 + row_tokens and lengths[0] == 12 + 11 and len(lengths) > 6
            assert all(length <= bound or length <= 1 + max(map(len, reasonings)) for length in lengths)


@pytest.mark.parametrize(
    "lengths, bound, groups",
    [
        ([12, 11, 11, 9], 30, [[0, 1], [2, 3]]),
        ([12, 11, 11, 9], 8192, [[0, 1, 2, 3]]),
        ([40, 12, 3, 0, 0], 30, [[0], [1, 2], [3, 4]]),  # a prefix beyond the bound alone; empty ones apart
        ([0, 0], 1, [[0, 1]]),
    ],
)
def test_varlen_groups_prompts_while_their_prefixes_fit_one_forward(lengths, bound, groups):
    assert packed_scoring._packed_groups(lengths, bound) == groups


@pytest.mark.parametrize("kind, attention", [("qwen2", "varlen"), ("llama", "varlen"), ("qwen2", "efficient")])
def test_scopes_score_what_each_scope_alone_does_in_shared_forwards(kind, attention):
    """Three scopes, one sharing a prompt and a reasoning with another and one without reasonings: each scope's
    matrices equal `cross_score` of that scope alone (and the naive pairs). With "varlen" all scopes' distinct
    prompts run in one prefix forward and all rows in one row forward (the single-scope calls take two each)."""
    model = tiny_model(kind)
    scopes = [
        (SIMILAR_PROMPTS, MIXED_REASONINGS[:4]),
        ([MIXED_PROMPTS[0], SIMILAR_PROMPTS[1], MIXED_PROMPTS[2]], [MIXED_REASONINGS[2], *REASONINGS]),
        (PROMPTS[:2], []),
    ]
    forwards = []
    record_forward(model, forwards)
    got = cross_score_scopes(model, [p for p, _ in scopes], [z for _, z in scopes], attention=attention)
    shared = len(forwards)
    alone = [cross_score(model, prompts, reasonings, attention=attention) for prompts, reasonings in scopes]
    model.get_decoder()._forward_pre_hooks.clear()
    if attention == "varlen":
        assert shared == 2 and len(forwards) == shared + 2 * 2  # the scope without reasonings runs no forward
    for (l_tok, l_sum), (want_tok, want_sum), (prompts, reasonings) in zip(got, alone, scopes, strict=True):
        assert l_sum.shape == (len(reasonings), len(prompts))
        torch.testing.assert_close(l_sum, want_sum, atol=1e-5, rtol=0)
        torch.testing.assert_close(l_tok, want_tok, atol=1e-5, rtol=0)
        torch.testing.assert_close(
            l_sum, naive_matrix(model, prompts, reasonings).reshape(l_sum.shape), atol=1e-4, rtol=0
        )


def test_scopes_score_one_at_a_time_where_the_rows_cannot_run_packed():
    model = tiny_model("qwen2-sliding")
    scopes = [(MIXED_PROMPTS, MIXED_REASONINGS[:3]), (SIMILAR_PROMPTS[:2], REASONINGS)]
    got = cross_score_scopes(model, [p for p, _ in scopes], [z for _, z in scopes])
    for (_, l_sum), (prompts, reasonings) in zip(got, scopes, strict=True):
        torch.testing.assert_close(l_sum, naive_matrix(model, prompts, reasonings), atol=1e-4, rtol=0)


def test_scopes_name_the_scope_of_a_bad_input():
    model = tiny_model("qwen2")
    with pytest.raises(ValueError, match=r"scope 1: reasonings\[0\] is empty"):
        cross_score_scopes(model, [PROMPTS, PROMPTS], [REASONINGS, [[]]])
    with pytest.raises(ValueError, match=r"scope 0: prompts\[1\] is empty"):
        cross_score_scopes(model, [[PROMPTS[0], []], PROMPTS], [REASONINGS, REASONINGS])
    with pytest.raises(ValueError, match="one list per scope"):
        cross_score_scopes(model, [PROMPTS, PROMPTS], lambda: [REASONINGS])
    with pytest.raises(ValueError, match="at least one"):
        cross_score_scopes(model, [], [])


def test_reasonings_given_as_a_function_are_made_once_the_first_prefixes_are_queued():
    """The diagnostics tokenise the reasoning texts while the device encodes the prompts: the function is called
    after the prefix forward and before the row forward, once, and the scores are those of the lists."""
    model = tiny_model("qwen2")
    scopes = [SIMILAR_PROMPTS, [MIXED_PROMPTS[0], MIXED_PROMPTS[2]]]  # no one-token prompt: one prefix group
    lists = [MIXED_REASONINGS[:3], REASONINGS]
    forwards, calls = [], []

    def reasonings():
        calls.append(len(forwards))
        return lists

    record_forward(model, forwards)
    got = cross_score_scopes(model, scopes, reasonings)
    model.get_decoder()._forward_pre_hooks.clear()
    assert calls == [1] and len(forwards) == 2  # after the prefix forward, before the rows'
    for (l_tok, l_sum), (want_tok, want_sum) in zip(got, cross_score_scopes(model, scopes, lists), strict=True):
        torch.testing.assert_close(l_sum, want_sum, atol=0, rtol=0)
        torch.testing.assert_close(l_tok, want_tok, atol=0, rtol=0)


@pytest.mark.parametrize(
    "sizes, wanted, bound",
    [
        ([10] * 5, [set(range(5))] * 2, 40),  # greedy would fill 40, 40 and 20 tokens
        ([105, 98, 97, 90, 64, 30, 12], [set(range(7))] * 16, 2200),  # shares of 1984 tokens
        ([7, 5, 3], [{0, 2}, {1}], 100),  # members want different reasonings; one forward
        ([50, 5, 5], [{0, 1, 2}], 20),  # a row beyond the bound on its own
    ],
)
def test_rows_are_packed_into_as_few_forwards_as_the_bound_allows_with_about_equal_tokens(sizes, wanted, bound):
    batches = packed_scoring._pack_tokens(sizes, wanted, bound)
    rows = [(member, k) for k in range(len(sizes)) for member, ks in enumerate(wanted) if k in ks]
    assert sorted(row for batch in batches for row in batch) == sorted(rows)  # every wanted row once
    assert all(batch == sorted(batch, key=lambda row: row[0]) for batch in batches)  # by member, for the segments
    tokens = [sum(sizes[k] for _, k in batch) for batch in batches]
    assert all(t <= bound or len(batch) == 1 for t, batch in zip(tokens, batches, strict=True))
    oversized = sum(size > bound for size in sizes)
    assert len(batches) <= -(-sum(tokens) // bound) + oversized
    if not oversized:
        assert max(tokens) - min(tokens) <= max(sizes)


def test_varlen_leaves_the_models_attention_setting_as_it_found_it():
    model = tiny_model("llama")
    assert_matches_naive(model, PROMPTS, REASONINGS, attention="varlen")
    assert model.config._attn_implementation == "sdpa"


def test_varlen_falls_back_where_the_attention_cannot_run_packed():
    """Sliding-window layers pass a window to the attention, which the packed attention refuses instead of ignoring:
    the scorer then takes the masked path (which finds the sliding cache unusable too and scores whole pairs)."""
    model = tiny_model("qwen2-sliding")
    forwards = []
    record_forward(model, forwards)
    _, l_sum = cross_score(model, MIXED_PROMPTS, MIXED_REASONINGS, max_tokens_per_forward=40)
    # the prefixes (15, 11, 8 and 4 tokens) packed, refused in the first layer; then the masked path's longest prefix
    assert forwards[:2] == [(1, 15 + 11 + 8 + 4, 0), (1, 15, 0)]
    assert model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(l_sum, naive_matrix(model, MIXED_PROMPTS, MIXED_REASONINGS), atol=1e-4, rtol=0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlashAttention's variable-length kernel needs CUDA")
@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_varlen_on_cuda_scores_what_the_masked_path_does_in_bf16(kind):
    model = tiny_model(kind).to("cuda", torch.bfloat16)
    prompts = [*MIXED_PROMPTS, *token_lists([40, 37, 52], seed=6)]
    want = cross_score(model, prompts, MIXED_REASONINGS, max_tokens_per_forward=64, attention="efficient")[0]
    for bound in (8192, 64):
        l_tok = cross_score(model, prompts, MIXED_REASONINGS, max_tokens_per_forward=bound, attention="varlen")[0]
        torch.testing.assert_close(l_tok, want, atol=2e-2, rtol=0)
