"""`bench.common`: the update's FLOP count by hand, full fine-tuning and LoRA, and the parameter counts
it reads off a LoRA-wrapped policy and critic."""

from __future__ import annotations

from types import SimpleNamespace

import torch
import transformers

from bench.common import Weights, module_weights, update_flops
from ragen_lit.models import apply_lora
from ragen_lit.models.critic import Critic

CONFIG = SimpleNamespace(hidden_size=2, num_hidden_layers=1, vocab_size=3)  # E = V·d = 6
# two sequences of 3 and 2 real tokens; scored positions: (0, 2) and (1, 1) -> s = 5 tokens, h = 2 scored;
# attention = 12·1·2·(9 + 4) = 312
MINIBATCH = {
    "attention_mask": torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool),
    "loss_mask": torch.tensor([[0, 0, 1], [0, 1, 0]], dtype=torch.bool),
}


def test_update_flops_by_hand_full_fine_tuning():
    exact, naive = update_flops(CONFIG, [MINIBATCH], Weights(10, 10, True), Weights(7, 7, True))
    policy = 6 * (10 - 6) * 5 + 6 * 6 * 2 + 312  # 120 + 72 + 312
    critic = 6 * (7 - 6) * 5 + 312  # 30 + 312
    assert exact == policy + critic == 846
    assert naive == (6 * 10 * 5 + 312) + (6 * 7 * 5 + 312) == 1134


def test_update_flops_by_hand_lora_counts_weight_gradients_of_the_trainable_parameters_only():
    # policy: 10 base parameters + 2 adapter ones, only the adapters train; critic: 7 + 2, adapters and a
    # 2-parameter value head train; the embedding (the policy's tied head) is frozen in both
    policy, critic = Weights(12, 2, False), Weights(9, 4, False)
    exact, naive = update_flops(CONFIG, [MINIBATCH], policy, critic)
    policy_flops = (4 * (12 - 6) + 2 * 2) * 5 + 4 * 6 * 2 + 312  # 140 + 48 + 312: the head has no weight gradient
    critic_flops = (4 * (9 - 6) + 2 * 4) * 5 + 312  # 100 + 312
    assert exact == policy_flops + critic_flops == 912
    as_if_fully_trained = update_flops(CONFIG, [MINIBATCH], Weights(12, 12, True), Weights(9, 9, True))[0]
    assert as_if_fully_trained == (6 * 6 * 5 + 6 * 6 * 2 + 312) + (6 * 3 * 5 + 312) == 966 != exact
    assert naive == (6 * 12 * 5 + 312) + (6 * 9 * 5 + 312) == 1254  # the naive count ignores LoRA


def test_module_weights_of_a_lora_policy_and_critic():
    config = transformers.Qwen2Config(
        vocab_size=50,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    adapters = {"r": 2, "alpha": 4.0, "dropout": 0.0, "target_modules": ["all-linear"]}
    policy = transformers.Qwen2ForCausalLM(config)
    base = sum(p.numel() for p in policy.parameters())
    policy = apply_lora(policy, **adapters, causal_lm=True)
    critic = Critic(apply_lora(transformers.Qwen2Model(config), **adapters, causal_lm=False), hidden_size=16)
    # r·(in + out) per linear layer: q 16→16, k 16→8, v 16→8, o 16→16, gate 16→32, up 16→32, down 32→16
    lora = 2 * (32 + 24 + 24 + 32 + 48 + 48 + 48)
    assert lora == 512
    policy_weights, critic_weights = module_weights(SimpleNamespace(policy=policy, critic=critic))
    assert policy_weights == Weights(total=base + lora, trainable=lora, embedding_trains=False)
    assert critic_weights == Weights(total=base + lora + 17, trainable=lora + 17, embedding_trains=False)
    assert module_weights(SimpleNamespace(policy=policy, critic=None))[1] is None
