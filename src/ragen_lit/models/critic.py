"""The critic: an LM backbone plus a scalar value head, aligned with `token_logprobs`."""

from __future__ import annotations

import torch
from torch import nn

from ragen_lit.logprobs import HostMasks, decoder_inputs, pack_rows
from ragen_lit.models.loaders import attention_kwargs, resolve_dtype, warn_if_untested_transformers


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

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        packed: bool = False,
        host_masks: HostMasks | None = None,
    ) -> torch.Tensor:
        """`values` [B, T] float32 of `input_ids` [B, T] under `attention_mask` [B, T]; `packed`: run the
        backbone padding-free on the rows end to end (`logprobs.pack_rows`), with the same values. `host_masks`: the
        mask's CPU copy (`HostMasks`, its score mask unused), which the padding layout is then read from without
        waiting for the device."""
        host_mask = None if host_masks is None else host_masks.attention_mask
        # use_cache=False: a backbone's config asks for a KV cache by default, which would copy every
        # layer's keys and values for nothing and send the layers down the eager path (`compile_layers`)
        if packed:
            rows = pack_rows(input_ids, attention_mask, host_mask)
            hidden = self.backbone(input_ids=rows.input_ids, position_ids=rows.position_ids, use_cache=False)
            v = self._head(hidden.last_hidden_state)[0][rows.index]  # [1, N] -> [B, T]
        else:
            decoder_mask, position_ids = decoder_inputs(attention_mask, host_mask)
            hidden = self.backbone(
                input_ids=input_ids, attention_mask=decoder_mask, position_ids=position_ids, use_cache=False
            )
            v = self._head(hidden.last_hidden_state)
        values = torch.zeros_like(v)
        values[:, 1:] = v[:, :-1] * attention_mask[:, :-1]  # 0 after padding positions
        return values

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] hidden states -> [...] float32 values."""
        return self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1).float()


def load_critic(path: str, dtype: str, attention: str = "auto", accelerator: str = "auto") -> Critic:
    from transformers import AutoModel

    warn_if_untested_transformers()
    torch_dtype = resolve_dtype(dtype, accelerator)
    backbone = AutoModel.from_pretrained(path, dtype=torch_dtype, **attention_kwargs(attention))
    critic = Critic(backbone, backbone.config.hidden_size)
    critic.value_head.to(torch_dtype)
    return critic
