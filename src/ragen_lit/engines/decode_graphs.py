"""Fixed-shape one-token decode steps, replayed from captured CUDA graphs on GPU.

Decoding a 0.5B model at batch 128 launches some 400 small kernels per token, and in eager mode the
launches, not the GPU, bound the step (docs/PERFORMANCE.md: 27.8 ms a step where reading the weights
and the cache takes ~1 ms). A CUDA graph replays all of them with one launch, but only over fixed
shapes and fixed tensor addresses. So a `DecodeSlot` owns, for one (batch bucket, cache length):

- a transformers `StaticCache` (written in place at each layer's on-device `cumulative_length`),
- static input buffers: `input_ids [B, 1]`, `position_ids [B, 1]`, and an additive attention mask
  `[B, 1, 1, L]` (0 where a row attends, the dtype's minimum elsewhere), passed to the model as a
  prepared 4D mask so that transformers builds none (its mask builder synchronises with the host),
- the captured forward (own memory pool), whose logits land in the same output buffer at every replay.

Each step writes the sampled ids, the positions and one mask column in place and replays. Rows of a
chunk smaller than the bucket are padding whose outputs are ignored. On CPU the same slot runs the
forward eagerly instead of replaying a graph: same shapes, same results, which is what CPU tests use.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from contextlib import nullcontext

import torch
from transformers import Cache, StaticCache

from ragen_lit.models import forward_cache_keyword, kv_heads_and_dim
from ragen_lit.models.decode_attention import split_decode_attention
from ragen_lit.models.fused_projections import FusedProjections
from ragen_lit.models.gqa_attention import folded_gqa
from ragen_lit.shapes import round_up

# Buckets: batch sizes are rounded up to a power of two (at least this), cache lengths to a multiple
# of this many positions. Each (batch, length) pair is captured once and kept.
_MIN_BATCH_BUCKET = 8
_LENGTH_BUCKET = 256
# Slots kept alive (least recently used dropped first): each holds a whole static KV cache. At most
# this many, and on a GPU at most this fraction of its memory in caches (a 5-turn episode needs ~5).
_MAX_SLOTS = 8
_MAX_CACHE_FRACTION = 0.25
# Warm-up forwards before a capture (lazy initialisation, cuBLAS workspaces, autotuning).
_WARMUP_FORWARDS = 2


def decode_step(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    mask: torch.Tensor,
    position_ids: torch.Tensor,
    cache: StaticCache,
    cache_keyword: str,
) -> torch.Tensor:
    """One forward over a slot's buffers (the cache written in place): a decode step's one token per row, or a kept
    turn's new tokens (`DecodeSlot.prefill`); the logits of each row's last token `[B, V]`."""
    out = model(
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=position_ids,
        use_cache=True,
        logits_to_keep=1,
        **{cache_keyword: cache},
    )
    return out.logits[:, -1]


@functools.cache
def compiled_step():
    """`decode_step` through `torch.compile` (one graph, made on first use: inductor fuses the ~30 small kernels
    a layer launches per step, rotary embedding, cache writes, norms and residual adds). Slots of a new shape
    recompile once, after which dynamo makes the changed sizes dynamic; the warm-up forwards before a capture
    pay the compilation, never the capture."""
    return torch.compile(decode_step, fullgraph=True)


def attention_kernel(model: torch.nn.Module, split: bool):
    """Inside: `model`'s one-token steps attend with flash-decoding's kernels (`split`, where Triton runs; see
    `models.decode_attention`), else with sdpa (PyTorch's choice of kernel) with the grouped query heads folded
    (`folded_gqa`: no key/value copies, also inside `torch.compile`). A fresh context at every call."""
    return split_decode_attention(model) if split else folded_gqa(model)


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why `model` cannot use fixed-shape decoding (None if it can): the 4D additive mask suits the
    `sdpa` and `eager` attention implementations, and full attention in every layer."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "get_text_config"):
        return "not a transformers model (no config)"
    implementation = getattr(config, "_attn_implementation", None) or "eager"
    if implementation not in ("sdpa", "eager"):
        return f"attention implementation {implementation!r} (needs 'sdpa' or 'eager')"
    layer_types = getattr(config.get_text_config(decoder=True), "layer_types", None) or ["full_attention"]
    if any(kind != "full_attention" for kind in layer_types):
        return "sliding-window or other non-full attention layers"
    return None


def batch_bucket(batch_size: int, max_batch_size: int) -> int:
    """The smallest power of two >= batch_size (at least 8), but never above max(batch_size, max_batch_size)."""
    bucket = max(_MIN_BATCH_BUCKET, 1 << (batch_size - 1).bit_length())
    return min(bucket, max(batch_size, max_batch_size))


def length_bucket(length: int) -> int:
    """`length` rounded up to a multiple of the length bucket."""
    return round_up(length, _LENGTH_BUCKET)


class DecodeSlot:
    """Static cache, input buffers and (on CUDA) the captured one-token forward for one shape."""

    def __init__(
        self,
        model: torch.nn.Module,
        batch_size: int,
        length: int,
        device: torch.device,
        split_attention: bool = False,
        compiled: bool = False,
        fused: FusedProjections | None = None,
    ):
        self.model = model
        self.split_attention = split_attention
        self.compiled = compiled
        self.fused = fused
        self.cache_keyword = forward_cache_keyword(model)
        self.batch_size, self.length = batch_size, length
        dtype = next(model.parameters()).dtype
        self.mask_min = torch.finfo(dtype).min
        self.cache = StaticCache(config=model.config, max_cache_len=length)
        kv_heads, head_dim = kv_heads_and_dim(model.config)
        self.cache.early_initialization(batch_size, kv_heads, head_dim, dtype, device)
        self.input_ids = torch.zeros(batch_size, 1, dtype=torch.long, device=device)
        self.position_ids = torch.zeros(batch_size, 1, dtype=torch.long, device=device)
        self.mask = torch.full((batch_size, 1, 1, length), self.mask_min, dtype=dtype, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None
        self.cache_bytes = sum(
            t.numel() * t.element_size() for layer in self.cache.layers for t in (layer.keys, layer.values)
        )

    def forward(self) -> torch.Tensor:
        """One forward over the static buffers (eager, or `compiled_step`'s), its attention on `attention_kernel`'s
        kernel: logits `[B, V]` of the next token."""
        step = compiled_step() if self.compiled else decode_step
        with (
            attention_kernel(self.model, self.split_attention),
            self.fused.applied() if self.fused is not None else nullcontext(),
        ):
            return step(self.model, self.input_ids, self.mask, self.position_ids, self.cache, self.cache_keyword)

    def capture(self) -> None:
        """Record `forward` in a CUDA graph (after warm-up forwards on a side stream)."""
        stream = torch.cuda.Stream(self.input_ids.device)
        stream.wait_stream(torch.cuda.current_stream(self.input_ids.device))
        with torch.cuda.stream(stream):
            for _ in range(_WARMUP_FORWARDS):
                self.forward()
        torch.cuda.current_stream(self.input_ids.device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self.forward()

    def load(
        self, prefix: Cache, rows: torch.Tensor | None, prompt_mask: torch.Tensor, positions: torch.Tensor
    ) -> None:
        """Start decoding after a prefill: copy the prefix cache (`rows`: which prefix row each chunk
        row continues, or None for one-to-one) into the static cache and set the mask and positions.

        `prompt_mask: [b, W] bool` (b <= batch bucket rows; the rest are padding rows that attend
        to position 0 only), `positions: [b]` the position of each row's next token."""
        batch, width = prompt_mask.shape
        for static_layer, prefix_layer in zip(self.cache.layers, prefix.layers):
            keys, values = prefix_layer.keys, prefix_layer.values
            if rows is not None:
                keys, values = keys[rows], values[rows]
            static_layer.keys[:batch, :, :width].copy_(keys)
            static_layer.values[:batch, :, :width].copy_(values)
            static_layer.cumulative_length.fill_(width)
        self._start_decoding(prompt_mask, positions)

    def _start_decoding(self, prompt_mask: torch.Tensor, positions: torch.Tensor) -> None:
        """The mask and positions of the first decode step: each of the `b` rows attends its `prompt_mask: [b, W]`
        positions, padding rows position 0; row b's next token sits at `positions[b]`."""
        batch, width = prompt_mask.shape
        self.mask.fill_(self.mask_min)
        self.mask[:batch, 0, 0, :width].masked_fill_(prompt_mask, 0.0)
        self.mask[batch:, 0, 0, 0] = 0.0
        self.position_ids.zero_()
        self.position_ids[:batch, 0] = positions

    def adopt(self, source: DecodeSlot, rows: torch.Tensor, width: int) -> None:
        """Copy the first `width` cache columns of `source`'s rows `rows` into this slot's first `len(rows)` rows
        (`source` may be this slot: the rows are gathered before they are written)."""
        batch = rows.shape[0]
        for layer, kept in zip(self.cache.layers, source.cache.layers):
            layer.keys[:batch, :, :width] = kept.keys[rows, :, :width]
            layer.values[:batch, :, :width] = kept.values[rows, :, :width]

    def prefill(
        self, input_ids: torch.Tensor, prompt_mask: torch.Tensor, position_ids: torch.Tensor, width: int
    ) -> torch.Tensor:
        """Run `input_ids: [b, S]` (a kept turn's new tokens, left-padded) at cache columns `[width, width + S)`
        on top of the columns before (`adopt`), then start decoding after them as `load` does. `prompt_mask:
        [b, width + S] bool` the positions each row attends, `position_ids: [b, S]`. Each new token attends its
        row's masked positions up to its own column: sdpa over the whole bucket under a `[B, 1, S, L]` bias (the
        slot's one-token kernels serve the decode steps only).
        Padding rows of the bucket attend column 0. Returns the logits of each row's last token, `[b, V]`."""
        batch, new = input_ids.shape
        device = input_ids.device
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(width)  # the cache writes the S new keys and values from here
        ids = torch.zeros(self.batch_size, new, dtype=input_ids.dtype, device=device)
        ids[:batch] = input_ids
        positions = torch.zeros(self.batch_size, new, dtype=position_ids.dtype, device=device)
        positions[:batch] = position_ids
        attend = torch.zeros(self.batch_size, self.length, dtype=torch.bool, device=device)
        attend[:batch, : width + new] = prompt_mask
        attend[batch:, 0] = True
        columns = torch.arange(self.length, device=device)
        causal = columns[None, :] <= width + torch.arange(new, device=device)[:, None]  # [S, L]
        bias = torch.zeros(self.batch_size, 1, new, self.length, dtype=self.mask.dtype, device=device)
        bias.masked_fill_(~(attend[:, None, None, :] & causal), self.mask_min)
        with attention_kernel(self.model, self.split_attention):
            logits = decode_step(self.model, ids, bias, positions, self.cache, self.cache_keyword)
        self._start_decoding(prompt_mask, prompt_mask.sum(-1))
        return logits[:batch]

    def step(self, next_ids: torch.Tensor, positions: torch.Tensor, column: int) -> torch.Tensor:
        """Feed one token per row (written at cache column `column`); return logits `[B, V]`."""
        batch = next_ids.shape[0]
        self.input_ids[:batch, 0] = next_ids
        self.position_ids[:batch, 0] = positions
        self.mask[:, 0, 0, column] = 0.0
        if self.graph is None:
            return self.forward()
        self.graph.replay()
        return self.logits


class DecodeGraphs:
    """The slots of one model, captured on CUDA (replayed) and eager elsewhere."""

    def __init__(
        self,
        model: torch.nn.Module,
        max_batch_size: int,
        max_cache_bytes: int | None = None,
        split_attention: bool = False,
        compiled: bool = False,
        fuse_projections: bool = False,
    ):
        """`max_cache_bytes`: most bytes of static caches kept across slots (default: a quarter of the
        GPU's memory on CUDA, unbounded elsewhere); the slot in use is always kept. `split_attention`: the steps
        attend with flash-decoding's kernels (`attention_kernel`). `compiled`: each slot's step is the whole forward
        through `torch.compile` (`compiled_step`), captured like the eager one. `fuse_projections`: the steps run
        the projections that share an input as one product (`models.fused_projections`; `refresh` before use)."""
        self.model = model
        self.split_attention = split_attention
        self.compiled = compiled
        self.max_batch_size = max_batch_size
        self.max_cache_bytes = max_cache_bytes
        self.fuse_projections = fuse_projections
        self._slots: OrderedDict[tuple[int, int], DecodeSlot] = OrderedDict()
        self._weights = self._weight_addresses()
        self.fused = FusedProjections(model) if fuse_projections else None

    def refresh(self) -> None:
        """Bring the fused projections' weights up to the model's (a no-op without them): call before decoding with
        weights that may have changed since."""
        if self.fused is not None:
            self.fused.refresh()

    def _weight_addresses(self) -> tuple[tuple[int, torch.dtype], ...]:
        return tuple((p.data_ptr(), p.dtype) for p in self.model.parameters())

    def slot(self, batch_size: int, length: int, device: torch.device) -> DecodeSlot:
        """The slot for at least `batch_size` rows and `length` cache positions (made on first use)."""
        weights = self._weight_addresses()
        if weights != self._weights:
            # the weights were moved or replaced (e.g. `.to(...)` off the GPU and back): a captured graph
            # would read the freed memory, so every slot is captured again (on fused weights made anew)
            self._slots.clear()
            self._weights = weights
            self.fused = FusedProjections(self.model) if self.fuse_projections else None
        key = (batch_bucket(batch_size, self.max_batch_size), length_bucket(length))
        slot = self._slots.pop(key, None)
        if slot is None:
            while len(self._slots) >= _MAX_SLOTS:
                self._slots.popitem(last=False)
            slot = DecodeSlot(self.model, *key, device, self.split_attention, self.compiled, self.fused)
            if device.type == "cuda":
                slot.capture()
        budget = self.max_cache_bytes
        if budget is None and device.type == "cuda":
            budget = int(_MAX_CACHE_FRACTION * torch.cuda.get_device_properties(device).total_memory)
        if budget is not None:
            while self._slots and slot.cache_bytes + sum(s.cache_bytes for s in self._slots.values()) > budget:
                self._slots.popitem(last=False)
        self._slots[key] = slot
        return slot
