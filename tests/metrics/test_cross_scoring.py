"""cross_score against a naive per-pair full-logits computation on tiny random models."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from ragen_lit.metrics import cross_score

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
    model = Qwen2ForCausalLM(Qwen2Config(**TINY)) if kind == "qwen2" else LlamaForCausalLM(LlamaConfig(**TINY))
    return model.float().eval()


def token_lists(lengths: list[int], seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (length,), generator=generator).tolist() for length in lengths]


def naive_sequence_logprob(model, prompt: list[int], reasoning: list[int]) -> float:
    """Σ_t log p(z_t | x, z_<t) from one unpadded forward with full fp32 logits."""
    ids = torch.tensor([prompt + reasoning])
    with torch.no_grad():
        log_probs = model(input_ids=ids).logits.float().log_softmax(-1)[0]
    positions = torch.arange(len(prompt), len(prompt) + len(reasoning))
    return float(log_probs[positions - 1, ids[0, positions]].sum())


def record_forward(model, shapes: list) -> None:
    """Append the input-ids shape of every backbone forward to `shapes`."""
    model.get_decoder().register_forward_hook(
        lambda module, args, kwargs, out: shapes.append(kwargs["input_ids"].shape), with_kwargs=True
    )


PROMPTS = token_lists([5, 9, 3, 12], seed=1)
REASONINGS = token_lists([4, 1, 7, 10, 2], seed=2)


@pytest.mark.parametrize("kind, max_tokens_per_forward", [("qwen2", 8192), ("qwen2", 40), ("llama", 1), ("llama", 25)])
def test_matches_naive_per_pair(kind, max_tokens_per_forward):
    model = tiny_model(kind)
    l_tok, l_sum = cross_score(
        model, PROMPTS, REASONINGS, max_tokens_per_forward=max_tokens_per_forward, pad_token_id=7
    )
    assert l_tok.shape == l_sum.shape == (5, 4) and l_sum.dtype == torch.float32
    want = torch.tensor([[naive_sequence_logprob(model, x, z) for x in PROMPTS] for z in REASONINGS])
    torch.testing.assert_close(l_sum, want, atol=1e-4, rtol=0)
    lengths = torch.tensor([len(z) for z in REASONINGS], dtype=torch.float32)
    torch.testing.assert_close(l_tok, want / lengths[:, None], atol=1e-4, rtol=0)


def test_forwards_and_head_chunks_respect_their_bounds():
    model = tiny_model("qwen2")
    forward_shapes, head_rows = [], []
    record_forward(model, forward_shapes)
    model.get_output_embeddings().register_forward_hook(lambda mod, args, out: head_rows.append(out.shape[0]))
    cross_score(model, PROMPTS, REASONINGS, max_tokens_per_forward=30, max_tokens_per_chunk=6)
    # 20 pairs of 4..22 tokens; the 22-token pair fits alone, the rest pack under 30 padded tokens
    assert sum(shape[0] for shape in forward_shapes) == 20
    assert all(rows * length <= 30 for rows, length in forward_shapes)
    assert len(forward_shapes) > 1 and max(head_rows) <= 6
    assert sum(head_rows) == 4 * sum(len(z) for z in REASONINGS)  # only reasoning tokens reach the head


def test_pair_longer_than_the_bound_gets_its_own_forward():
    model = tiny_model("qwen2")
    shapes = []
    record_forward(model, shapes)
    cross_score(model, [[1, 2, 3]], [[4, 5, 6, 7]], max_tokens_per_forward=5)
    assert shapes == [torch.Size([1, 7])]


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
    ],
)
def test_bad_inputs_raise(prompts, reasonings, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cross_score(tiny_model("qwen2"), prompts, reasonings, **kwargs)
