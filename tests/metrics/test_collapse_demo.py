"""Collapse demo: a real model's cross-scores separate input-grounded reasoning from a template.

Construction. A tiny random Qwen2 is trained for 100 steps (a few seconds) on sequences `x | z` where
the prompt `x = [BOS, c_1 … c_6, THINK]` carries 6 random content tokens and the reasoning `z` is, with
probability 1/2 each, either a restatement `c_1 … c_6` of the prompt's content or one fixed template
`T = t_1 … t_6` (tokens never used as content). The loss is on `z` only. So the policy has learned
p(restatement | x) ≈ 1/2 and p(T | x) ≈ 1/2 *for every x*: the template branch ignores the prompt.

Then N = 8 fresh prompts, K = 2 reasoning rows per prompt (R = 16 ≠ N, so rows and columns cannot be
confused), and two batches under the same prompts:

- restated: row r's reasoning restates its own prompt's content. Under its own prompt it costs about
  log 2 in total; under another prompt the copy is wrong from the first token. Retrieval-Acc ≈ 1 and
  MI-Est ≈ log N.
- template: every row's reasoning is T. All 16 rows are the same reasoning, so all rows of the score
  matrix are the same and every row's argmax is the same column j*: exactly the K rows whose prompt is
  j* are hits, so Retrieval-Acc = K/R = 1/N *exactly* (and Recall@2 = 2/N), whatever the model. This
  needs balanced groups (each prompt has K rows), as rollout groups are. MI-Est is then
  mean_j L_j − log mean_j exp L_j ≤ 0 (Jensen), and ≈ 0 only if the model scores T about equally under
  every prompt, which is what the training made true; an untrained model or a copy-only model would
  not give it. A wrong argmax (over rows, or argmin), a marginal without −log N, or a logsumexp over
  the wrong axis breaks these numbers.
"""

from __future__ import annotations

import math

import pytest
import torch

from ragen_lit.metrics import MIDiagnostics, cross_score

BOS, THINK = 1, 2
CONTENT = range(3, 19)  # 16 content tokens
TEMPLATE = list(range(19, 25))  # never used as content
LENGTH = 6
NUM_PROMPTS, ROWS_PER_PROMPT = 8, 2
LOG_N = math.log(NUM_PROMPTS)


@pytest.fixture(scope="module")
def policy():
    """The tiny Qwen2 trained on the restate-or-template mixture (see the module docstring)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small only loses time to thread hand-offs
    try:
        torch.manual_seed(0)
        config = Qwen2Config(
            vocab_size=32,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=32,
            pad_token_id=0,
        )
        model = Qwen2ForCausalLM(config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        batch = 64
        for _ in range(100):
            content = torch.randint(CONTENT.start, CONTENT.stop, (batch, LENGTH))
            restate = torch.rand(batch, 1) < 0.5
            reasoning = torch.where(restate, content, torch.tensor(TEMPLATE).expand(batch, LENGTH))
            ids = torch.cat([torch.full((batch, 1), BOS), content, torch.full((batch, 1), THINK), reasoning], 1)
            labels = ids.clone()
            labels[:, : LENGTH + 2] = -100  # learn the reasoning only
            loss = model(input_ids=ids, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        yield model
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def prompts_and_target():
    generator = torch.Generator().manual_seed(1)
    contents = [
        torch.randint(CONTENT.start, CONTENT.stop, (LENGTH,), generator=generator).tolist() for _ in range(NUM_PROMPTS)
    ]
    assert len({tuple(c) for c in contents}) == NUM_PROMPTS
    target = torch.arange(NUM_PROMPTS).repeat_interleave(ROWS_PER_PROMPT)  # [R] = [16]
    return contents, [[BOS, *c, THINK] for c in contents], target


def diagnostics(policy, prompts, reasonings, target):
    """Cross-score (5 pairs per forward, so chunking is exercised) and compute the MI family."""
    l_tok, l_sum = cross_score(policy, prompts, reasonings, max_tokens_per_forward=5 * (len(prompts[0]) + LENGTH))
    metric = MIDiagnostics()
    metric.update(l_tok.double(), l_sum.double(), target)
    return l_tok, {name: float(value) for name, value in metric.compute().items()}


def test_reasoning_that_restates_its_prompt_is_retrieved(policy, prompts_and_target):
    contents, prompts, target = prompts_and_target
    _, values = diagnostics(policy, prompts, [contents[j] for j in target.tolist()], target)
    assert values["retrieval_chance"] == 1 / NUM_PROMPTS
    assert values["retrieval_acc"] >= 0.9
    assert values["mi_est"] >= 0.9 * LOG_N
    assert values["mi_seq_est"] >= 0.9 * LOG_N
    assert values["mi_upper_bound"] == pytest.approx(LOG_N, abs=1e-12)
    assert values["mi_est"] <= LOG_N + 1e-9


def test_template_reasoning_is_exactly_chance_and_carries_no_information(policy, prompts_and_target):
    _, prompts, target = prompts_and_target
    l_tok, values = diagnostics(policy, prompts, [TEMPLATE] * len(target), target)
    # why retrieval is exactly chance: every row is the same score vector with a unique maximum
    assert torch.allclose(l_tok, l_tok[0].expand_as(l_tok), rtol=0, atol=1e-6)
    top2 = l_tok[0].topk(2).values
    assert top2[0] - top2[1] > 1e-3
    assert values["retrieval_acc"] == values["retrieval_chance"] == 1 / NUM_PROMPTS
    assert values["recall@2"] == values["recall@2_chance"] == 2 / NUM_PROMPTS
    assert values["retrieval_above_chance"] == 0.0
    # MI-Est ≤ 0 by Jensen for identical rows, and ≈ 0 because the model scores T alike under every prompt
    assert -0.01 * LOG_N < values["mi_est"] <= 1e-9
    assert -0.05 * LOG_N < values["mi_seq_est"] <= 1e-9
