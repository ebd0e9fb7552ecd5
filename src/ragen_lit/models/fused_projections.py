"""A decode step's projections that read one input, fused into one matrix product per input.

At a decode step (one token per row) a layer's matrix products are small and each costs its own kernel: a
Qwen2.5-0.5B layer runs seven (q, k, v, o, gate, up, down). On an H200 at batch 128 the 24 layers' seven took 933 us
per step against 648 us for four, q|k|v, o, gate|up, down (docs/PERFORMANCE.md). `FusedProjections`
keeps, per layer, the concatenated weights [W_q; W_k; W_v] (with their biases) and [W_gate; W_up]; inside its
`applied()` context

- q_proj, k_proj and v_proj share one product: the first of them called with a new input computes x [W_q; W_k; W_v]ᵀ
  (+ biases) and each returns its slice of it;
- the MLP computes down(silu(x W_gateᵀ) · x W_upᵀ) from one product x [W_gate; W_up]ᵀ, the gating compiled into one
  element-wise kernel (`torch.compile`, dynamic shapes).

The same products, up to the summation order of another kernel. The copies are made at construction and written
again by `refresh()`, which the engine calls at the start of every generation (the trainer's optimizer steps write
the model's own weights in place); captured CUDA graphs read the copies at fixed addresses. Layers whose
projections are not plain `nn.Linear` (LoRA adapters, quantised layers) or whose MLP's activation is not silu keep
their own forwards.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import torch
from torch import nn
from torch.nn import functional as F

_ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj")
_GATED_PROJECTIONS = ("gate_proj", "up_proj")


class _SharedProduct:
    """One fused product of linears that read the same input: the concatenated weight and bias (rows of each
    member in turn) and, while applied, the last input and its product."""

    def __init__(self, linears: list[nn.Linear]):
        self.linears = linears
        self.weight = torch.cat(self._parts("weight"))
        self.bias = None if linears[0].bias is None else torch.cat(self._parts("bias"))
        ends = list(itertools.accumulate(linear.out_features for linear in linears))
        self.slices = [slice(start, end) for start, end in zip([0, *ends], ends)]
        self._input: torch.Tensor | None = None
        self._product: torch.Tensor | None = None
        # made once: a compiled decode step guards on the functions it traced, so new ones would recompile it
        self.forwards = [self._member_forward(index) for index in range(len(linears))]

    def _parts(self, name: str) -> list[torch.Tensor]:
        """The members' `name` ("weight" or "bias") tensors, in order."""
        return [getattr(linear, name).detach() for linear in self.linears]

    def refresh(self) -> None:
        torch.cat(self._parts("weight"), out=self.weight)
        if self.bias is not None:
            torch.cat(self._parts("bias"), out=self.bias)

    def product(self, x: torch.Tensor) -> torch.Tensor:
        """x [W_1; W_2; ...]ᵀ (+ biases), computed once per input tensor."""
        if self._input is not x:
            self._input, self._product = x, F.linear(x, self.weight, self.bias)
        return self._product

    def _member_forward(self, index: int):
        """A forward for member `index`: its slice of the shared product."""

        def forward(x: torch.Tensor) -> torch.Tensor:
            return self.product(x)[..., self.slices[index]]

        return forward

    def forget(self) -> None:
        self._input = self._product = None


@functools.cache
def _compiled_gating():
    return torch.compile(_gating, dynamic=True)


def _gating(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) · up for `gate_up: [..., 2I]`, the two halves side by side."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def _plain_linears(module: nn.Module, names: tuple[str, ...]) -> list[nn.Linear] | None:
    """`module`'s linears of these names, if each is a plain `nn.Linear` (not a subclass: LoRA, quantised) and
    they read inputs of one width with biases all present or all absent; else None."""
    linears = [getattr(module, name, None) for name in names]
    if not all(type(linear) is nn.Linear for linear in linears):
        return None
    if len({linear.in_features for linear in linears}) != 1 or len({linear.bias is None for linear in linears}) != 1:
        return None
    if len({(linear.weight.dtype, linear.weight.device) for linear in linears}) != 1:
        return None
    return linears


class FusedProjections:
    """The fused products of every attention and MLP of `model` that can have them (see the module docstring)."""

    def __init__(self, model: nn.Module):
        self.attentions: list[_SharedProduct] = []
        self.mlps: list[tuple[nn.Module, _SharedProduct]] = []
        self._mlp_forwards = []  # made once, as `_SharedProduct.forwards`
        with torch.no_grad():
            for module in model.modules():
                linears = _plain_linears(module, _ATTENTION_PROJECTIONS)
                if linears is not None:
                    self.attentions.append(_SharedProduct(linears))
                linears = _plain_linears(module, _GATED_PROJECTIONS)
                if (
                    linears is not None
                    and isinstance(getattr(module, "down_proj", None), nn.Module)
                    and _is_silu(module)
                ):
                    self.mlps.append((module, _SharedProduct(linears)))
                    self._mlp_forwards.append(functools.partial(_fused_mlp, module.down_proj, self.mlps[-1][1]))

    def __len__(self) -> int:
        return len(self.attentions) + len(self.mlps)

    def refresh(self) -> None:
        """Copy the model's current weights into the fused ones (in place: graphs captured on them stay valid)."""
        with torch.no_grad():
            for shared in self.attentions:
                shared.refresh()
            for _, shared in self.mlps:
                shared.refresh()

    @contextmanager
    def applied(self) -> Iterator[None]:
        """Inside: the fused products replace the separate ones (instance `forward`s, restored on exit)."""
        with ExitStack() as stack:
            for shared in self.attentions:
                stack.callback(shared.forget)
                for linear, forward in zip(shared.linears, shared.forwards):
                    stack.enter_context(_forward_replaced(linear, forward))
            for (mlp, shared), forward in zip(self.mlps, self._mlp_forwards):
                stack.callback(shared.forget)
                stack.enter_context(_forward_replaced(mlp, forward))
            yield


def _fused_mlp(down_proj: nn.Linear, gate_up: _SharedProduct, x: torch.Tensor) -> torch.Tensor:
    gating = _gating if torch.compiler.is_compiling() else _compiled_gating()
    return down_proj(gating(gate_up.product(x)))


def _is_silu(mlp: nn.Module) -> bool:
    """The MLP's activation is silu (transformers builds `act_fn` from its config's `hidden_act`)."""
    return getattr(getattr(mlp, "config", None), "hidden_act", None) in ("silu", "swish")


@contextmanager
def _forward_replaced(module: nn.Module, forward) -> Iterator[None]:
    """`module.forward` is `forward` inside; its own (an instance attribute such as `compile_layers`' dispatcher,
    or the class's) afterwards."""
    own = module.__dict__.get("forward")
    module.forward = forward
    try:
        yield
    finally:
        if own is None:
            del module.forward
        else:
            module.forward = own
