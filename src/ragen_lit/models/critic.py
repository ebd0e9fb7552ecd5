"""The critic: an LM backbone plus a scalar value head, aligned with `token_logprobs`."""

from __future__ import annotations

import torch
from torch import nn

from ragen_lit.logprobs import decoder_inputs
from ragen_lit.models.loaders import resolve_dtype, warn_if_untested_transformers


class Critic(nn.Module):
    """Value model: the LM backbone plus a scalar head.

    `values[:, t]` estimates the return from the state *before* token t is emitted (hidden state of
    position t−1), the same alignment as `token_logprobs`, so advantages, log-probs and values index
    the same token positions. Position 0, and every position after a padding position, is 0."""

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        decoder_mask, position_ids = decoder_inputs(attention_mask)
        # use_cache=False: a backbone's config asks for a KV cache by default, which would copy every
        # layer's keys and values for nothing and send the layers down the eager path (`compile_layers`)
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=decoder_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state
        v = self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1).float()
        values = torch.zeros_like(v)
        values[:, 1:] = v[:, :-1] * attention_mask[:, :-1]  # 0 after padding positions
        return values


def load_critic(path: str, dtype: str) -> Critic:
    from transformers import AutoModel

    warn_if_untested_transformers()
    backbone = AutoModel.from_pretrained(path, dtype=resolve_dtype(dtype))
    critic = Critic(backbone, backbone.config.hidden_size)
    critic.value_head.to(resolve_dtype(dtype))
    return critic
