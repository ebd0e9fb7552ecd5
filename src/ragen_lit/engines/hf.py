"""Batched sampling from a transformers causal LM with a KV cache: the rollout engine for small runs.

One `HFEngine.generate` call sorts the prompts by length (identical prompts end up adjacent), cuts
them into chunks of `max_batch_size` rows, and for each chunk

1. prefills every distinct prompt once (left-padded; position ids from the attention-mask cumsum)
   and copies its cache rows to each rollout sharing it (turn 1 of a group: 16 rollouts, 1 prompt);
2. decodes token by token (`decode_loops`): with a transformers KV cache (`DynamicCache`, or `StaticCache`
   with cache="static"), dropping finished rows from the batch as it goes; or with cache="graph" (the default on
   GPU, see `decode_graphs.py`) in a preallocated static cache, one captured CUDA graph replayed per token.

The graph cache has a fast path, each piece an engine argument, that samples within rounding of the plain one
(the same distribution; a token can differ where a draw falls within rounding of a boundary), and that
`rollout.exact=false` turns on as a whole:

- `share_prefixes`: a prefix that several prompts share without being identical (the later turns of a group start
  with its first prompt) is prefilled once, then each row's own suffix (`prefill.shared_prefix_plan`);
- `reuse_turns`: each row's cache is kept after a call, so that the next turn prefills only its new tokens
  (`kept_turns`);
- `split_attention`: the decode steps attend with flash-decoding's Triton kernels (`kernels.split_decode`);
- `fuse_projections`: the decode steps run q|k|v and gate|up as one matrix product each
  (`models.fused_projections`);
- `compile_decode`: each decode step is the whole forward through `torch.compile`, captured like the eager one.

The engine shares the policy module with the trainer, so `sync` only swaps the reference and the
engine always samples from the current weights (token-in/token-out: the ids it returns are the ids
the trainer scores). With `dtype` set where the policy's weights have another dtype (bfloat16 decoding of
float32 training weights), it decodes with a copy of the policy in `dtype` instead, whose weights `sync`
overwrites in place (captured decode graphs stay valid).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Sequence

import torch
from torch.profiler import record_function
from transformers import Cache, DynamicCache, StaticCache

from ragen_lit.choices import HF_CACHE_MODES
from ragen_lit.engines.base import Generation, SamplingParams, validate_request
from ragen_lit.engines.decode_graphs import DecodeGraphs, DecodeSlot, unsupported_reason
from ragen_lit.engines.decode_loops import Stops, decode_dynamic, decode_fixed
from ragen_lit.engines.kept_turns import KeptRows
from ragen_lit.engines.prefill import PrefixPlan, left_pad, shared_prefix_plan
from ragen_lit.models import forward_cache_keyword
from ragen_lit.models.gqa_attention import folded_gqa

# the graph cache's fast path, `HFEngine`'s arguments that `rollout.exact=false` turns on together
FAST_PATH = ("share_prefixes", "reuse_turns", "split_attention", "fuse_projections", "compile_decode")


class HFEngine:
    """The `Engine` over a transformers causal LM (any `*ForCausalLM`, PEFT-wrapped ones included).

    Args:
        model: the policy module; shared, not copied.
        pad_token_id: id placed left of shorter prompts (masked out, so any id works).
        max_batch_size: most sequences decoded together; lower it on out-of-memory errors.
        device: where inputs are put; default: the device of the model's first parameter.
        cache: the KV cache: "dynamic" (transformers `DynamicCache`, grows by concatenation every
            step) or "static" (`StaticCache`, preallocated for prompt + max_new_tokens and written
            in place; faster on CPU, see scripts/bench_engine.py) or "graph" (fixed-shape decoding:
            batch and cache length rounded up to buckets, rows kept until the whole chunk stops, each
            one-token forward captured once in a CUDA graph and replayed; on CPU the same loop runs
            eagerly. Needs sdpa/eager attention and full attention in every layer; see
            `decode_graphs.py`), or "auto": "graph" on CUDA where the model supports it, else "dynamic".
        dedup_prompts: prefill identical prompts of a chunk once and copy their cache rows (exact).
        dtype: decode with a copy of the model whose floating parameters are in this dtype, where some of the
            model's are not (None: the model itself). bfloat16 for float32 training weights halves the bytes of
            weights and KV cache every decode step reads; the sampled tokens then follow the bfloat16 model,
            as a vLLM engine in bfloat16 does. Buffers (rotary frequencies) keep their dtype, as when a model
            is loaded in bfloat16.
        share_prefixes, reuse_turns, split_attention, fuse_projections, compile_decode: the graph cache's fast path
            (module docstring), each off by default: the plain path is bit for bit what it always computed. They
            act on cache="graph" only. `split_attention` needs CUDA with Triton (elsewhere the steps keep sdpa);
            `fuse_projections` keeps concatenated copies of those weights (for Qwen2.5-0.5B ~0.5 GB in bfloat16),
            written again at every `generate` call; `compile_decode` pays its compilation in the first steps of
            each new slot shape. A kept row's cache keeps the masked positions of earlier turns (padding, the steps
            after its stop), so rows that stop early leave wider caches than a fresh prefill would.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        pad_token_id: int,
        max_batch_size: int = 256,
        device: torch.device | str | None = None,
        cache: str = "dynamic",
        dedup_prompts: bool = True,
        dtype: torch.dtype | None = None,
        share_prefixes: bool = False,
        reuse_turns: bool = False,
        split_attention: bool = False,
        fuse_projections: bool = False,
        compile_decode: bool = False,
    ) -> None:
        if not isinstance(pad_token_id, int) or pad_token_id < 0:
            raise ValueError(f"pad_token_id must be an int >= 0, got {pad_token_id!r}")
        if not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ValueError(f"max_batch_size must be an int >= 1, got {max_batch_size!r}")
        if cache not in HF_CACHE_MODES:
            raise ValueError(f"cache must be one of {HF_CACHE_MODES}, got {cache!r}")
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise ValueError(f"dtype must be a floating torch.dtype or None, got {dtype!r}")
        self.dtype = dtype
        self._source: torch.nn.Module | None = None  # the module last synced from
        self._kept: KeptRows | None = None  # reuse_turns: the last call's rows, until the next sync or release
        self.sync(model)
        if cache == "graph" and not self._graph_ok:
            raise ValueError(
                f"cache='graph' does not support this model: {unsupported_reason(model)}; use cache='dynamic'"
            )
        self.pad_token_id = pad_token_id
        self.max_batch_size = max_batch_size
        self.device = None if device is None else torch.device(device)
        self.cache = cache
        self.dedup_prompts = dedup_prompts
        self.share_prefixes = share_prefixes
        self.reuse_turns = reuse_turns
        self.split_attention = split_attention
        self.fuse_projections = fuse_projections
        self.compile_decode = compile_decode

    def sync(self, model: torch.nn.Module) -> None:
        """Sample from `model` from now on.

        The rollout loop syncs before every call. Without a `dtype` copy the module is shared, so its weights
        are always current and the same module keeps its captured decode graphs (they read the weights in place;
        `DecodeGraphs` re-captures if the weights move). With one, the copy is made at the first sync of a
        module and its weights are overwritten in place from `model` at every sync."""
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self._kept = None  # computed with the weights before this sync
        if self._source is model and (self.model is model or _same_device(model, self.model)):
            if self.model is not model:
                _copy_weights(model, self.model)
            return
        self._source = model
        self.model = model if self.dtype is None else _cast_copy(model, self.dtype)
        self._graphs: DecodeGraphs | None = None  # cache="graph": slots captured on this model
        self._graph_ok = unsupported_reason(self.model) is None
        self._cache_keyword = forward_cache_keyword(self.model)

    def release(self) -> None:
        """Forget the rows kept for the next turn (`reuse_turns`); the engine decodes with the trainer's own module
        (or its `dtype` copy), and its decode graphs and caches are kept for the next rollout."""
        self._kept = None

    def cache_kind(self, device: torch.device) -> str:
        """The cache kind used on `device`: `cache` itself, or what "auto" resolves to there."""
        if self.cache != "auto":
            return self.cache
        return "graph" if device.type == "cuda" and self._graph_ok else "dynamic"

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """Sample one continuation per prompt; results come back in the order of `prompts`.

        With `params.seed` set the call is reproducible, whatever the order of `prompts`: rows are
        sorted by (length, ids) before sampling, so each prompt meets the same random draws.
        """
        prompts = validate_request(prompts, params)
        if not prompts:
            return []
        # the prompts' ids are checked where a prefill puts the ids it embeds into its batch (`_left_pad`)
        vocab_size = self._vocab_size()
        if self.pad_token_id >= vocab_size:
            raise ValueError(f"pad_token_id must be below the vocabulary size {vocab_size}, got {self.pad_token_id}")
        device = self.device if self.device is not None else next(self.model.parameters()).device
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device=device)
            generator.manual_seed(params.seed)
        order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), prompts[i]))
        results: list[Generation | None] = [None] * len(prompts)
        modes = [(module, module.training) for module in self.model.modules()]
        self.model.eval()
        if len(order) > self.max_batch_size:  # the chunks would overwrite each other's slot rows
            self._kept = None
        try:
            with torch.no_grad():
                for start in range(0, len(order), self.max_batch_size):
                    chunk = order[start : start + self.max_batch_size]
                    generations = self._generate_chunk([prompts[i] for i in chunk], params, device, generator)
                    for i, generation in zip(chunk, generations):
                        results[i] = generation
        finally:
            for module, training in modes:
                module.training = training
        return results

    def _generate_chunk(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        device: torch.device,
        generator: torch.Generator | None,
    ) -> list[Generation]:
        try:
            return self._sample_chunk(prompts, params, device, generator)
        except RuntimeError as error:
            # CUDA raises OutOfMemoryError; the CPU allocator raises a plain RuntimeError.
            if not isinstance(error, torch.OutOfMemoryError) and "can't allocate memory" not in str(error):
                raise
            raise RuntimeError(
                f"out of memory while generating a batch of {len(prompts)} sequences (longest prompt "
                f"{max(len(p) for p in prompts)} tokens, max_new_tokens {params.max_new_tokens}); "
                f"lower rollout.max_batch_size (now {self.max_batch_size})"
            ) from error

    def _prefill(
        self, prompts: list[list[int]], max_new_tokens: int, device: torch.device, share: bool = False
    ) -> tuple[torch.Tensor, Cache, torch.Tensor, torch.Tensor | None]:
        """Run the prompts (sorted by length) through the model once.

        Returns `last_logits: [B, V]`, the cache, `attention_mask: [B, L] bool` and `copy_index`.
        With dedup on, each run of identical prompts is computed once: the cache then holds one row
        per distinct prompt, and `copy_index: [B]` says which cache row each prompt continues
        (None when the cache has the B rows already). With `share` (the graph cache's `share_prefixes`), where
        prompts share long prefixes without being identical (the later turns of a group) and that computes fewer
        positions, the shared prefixes are computed once instead and each row's own suffix after them
        (`_prefill_shared`).
        """
        distinct = prompts
        copy_index = None
        if self.dedup_prompts:
            is_new = [True] + [a != b for a, b in itertools.pairwise(prompts)]
            if not all(is_new):
                distinct = [p for p, new in zip(prompts, is_new) if new]
                copy_index = torch.tensor(is_new, device=device).cumsum(0) - 1
        if share:
            plan = shared_prefix_plan(prompts)
            if all(plan.prefixes) and plan.padded_tokens() < len(distinct) * max(map(len, distinct)):
                return self._prefill_shared(plan, max_new_tokens, device)
        input_ids, attention_mask = self._left_pad(distinct, device)
        cache = self._new_cache(input_ids.shape[1] + max_new_tokens)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        last_logits = self._forward_prompt(input_ids, attention_mask, position_ids, cache)
        if copy_index is not None:
            last_logits, attention_mask = last_logits[copy_index], attention_mask[copy_index]
        return last_logits, cache, attention_mask, copy_index

    def _vocab_size(self) -> int:
        return self.model.get_input_embeddings().num_embeddings

    def _left_pad(self, prompts: Sequence[Sequence[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """`left_pad` of ids a prefill forward embeds: with the pad id, checked against the vocabulary. Every prompt id
        a call embeds passes here, so `generate` need not check its lists (the kept turns' reused ids, which it does
        not embed, were checked or sampled by the call before)."""
        return left_pad(prompts, self.pad_token_id, device, self._vocab_size())

    def _prefill_shared(
        self, plan: PrefixPlan, max_new_tokens: int, device: torch.device
    ) -> tuple[torch.Tensor, Cache, torch.Tensor, None]:
        """Prefill in two forwards: the distinct prefixes (left-padded), their cache rows copied to the rows
        continuing them, then every row's suffix (left-padded) on top. A row's cache is then [padding, prefix,
        padding, suffix]; the mask hides the padding and the position ids count real tokens only, so each row
        sees exactly its prompt at its positions. Same returns as `_prefill` (the cache has the B rows)."""
        prefix_ids, prefix_mask = self._left_pad(plan.prefixes, device)
        suffix_ids, suffix_mask = self._left_pad(plan.suffixes, device)
        # copied from host memory before the first forward: a copy queued after it waits for it to finish
        rows = torch.tensor(plan.prefix_of, device=device)
        cache = self._new_cache(prefix_ids.shape[1] + suffix_ids.shape[1] + max_new_tokens)
        self._forward_prompt(prefix_ids, prefix_mask, (prefix_mask.cumsum(-1) - 1).clamp(min=0), cache)
        cache.reorder_cache(rows)
        attention_mask = torch.cat([prefix_mask[rows], suffix_mask], dim=1)
        position_ids = prefix_mask.sum(-1)[rows, None] + (suffix_mask.cumsum(-1) - 1).clamp(min=0)
        return self._forward_prompt(suffix_ids, attention_mask, position_ids, cache), cache, attention_mask, None

    def _new_cache(self, length: int) -> Cache:
        """An empty cache for a prefill: static for cache="static", else dynamic ("graph" copies it into its slot)."""
        if self.cache == "static":
            return StaticCache(config=self.model.config, max_cache_len=length)
        return DynamicCache(config=self.model.config)

    def _forward_prompt(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, cache: Cache
    ) -> torch.Tensor:
        """One prefill forward of `input_ids: [B, W]` into `cache` (`attention_mask` covers the cached positions
        too); returns the logits of the last position `[B, V]`."""
        cached = cache.get_seq_length()
        with folded_gqa(self.model):  # grouped-query heads under the padding mask without key/value copies
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=True,
                logits_to_keep=1,
                **{self._cache_keyword: cache},
            )
        if cache.get_seq_length() == cached:
            # A forward that does not know the keyword swallows it in **kwargs and decodes every later
            # token without its context: text that looks like text, and a success rate of 0.
            raise RuntimeError(
                f"{type(self.model).__name__} did not fill the KV cache passed as {self._cache_keyword}=; "
                "the decode loop cannot continue the prompts"
            )
        return out.logits[:, -1]

    def _sample_chunk(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        device: torch.device,
        generator: torch.Generator | None,
    ) -> list[Generation]:
        if self.cache_kind(device) == "graph":
            return self._sample_chunk_fixed(prompts, params, device, generator)
        logits, cache, prompt_mask, copy_index = self._prefill(prompts, params.max_new_tokens, device)
        if copy_index is not None:
            cache.reorder_cache(copy_index)
        return decode_dynamic(self.model, cache, self._cache_keyword, logits, prompt_mask, params, generator)

    def _sample_chunk_fixed(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        device: torch.device,
        generator: torch.Generator | None,
    ) -> list[Generation]:
        """cache="graph": the prefill (of the rows kept from the last call where every prompt continues one, else
        of the prompts) into a decode slot, then `decode_fixed`."""
        stops = Stops(params, device)  # host-memory copies, made before the prefill is queued (see _prefill_shared)
        kept, self._kept = self._kept, None
        continued = kept.continued(prompts) if kept is not None else None
        if self._graphs is None:
            self._graphs = DecodeGraphs(
                self.model,
                self.max_batch_size,
                split_attention=self.split_attention,
                compiled=self.compile_decode,
                fuse_projections=self.fuse_projections,
            )
        # the regions name the host's work in profiles (`bench.profiling.idle_gaps`)
        with record_function("ragen/engine.prefill"):
            if continued is not None:
                logits, slot, prompt_mask = self._prefill_kept(kept, continued, prompts, params.max_new_tokens, device)
            else:
                logits, slot, prompt_mask = self._prefill_into_slot(prompts, params.max_new_tokens, device)
        del kept
        self._graphs.refresh()  # the weights may have changed since the last call (an optimizer step)
        generations, fed = decode_fixed(slot, logits, prompt_mask, params, stops, generator)
        if self.reuse_turns:
            positions = prompt_mask.sum(-1)
            self._kept = KeptRows(slot, prompts, [g.token_ids for g in generations], prompt_mask, positions, fed)
        return generations

    def _prefill_into_slot(
        self, prompts: list[list[int]], max_new_tokens: int, device: torch.device
    ) -> tuple[torch.Tensor, DecodeSlot, torch.Tensor]:
        """`_prefill`, its cache then loaded into the decode slot of its shape. Same returns as `_prefill_kept`."""
        logits, prefix, prompt_mask, copy_index = self._prefill(prompts, max_new_tokens, device, self.share_prefixes)
        batch_size, prompt_width = prompt_mask.shape
        with record_function("ragen/engine.slot"):
            slot = self._graphs.slot(batch_size, prompt_width + max_new_tokens, device)
        with record_function("ragen/engine.load"):
            slot.load(prefix, copy_index, prompt_mask, prompt_mask.sum(-1))
        return logits, slot, prompt_mask

    def _prefill_kept(
        self, kept: KeptRows, continued: list[int], prompts: list[list[int]], max_new_tokens: int, device: torch.device
    ) -> tuple[torch.Tensor, DecodeSlot, torch.Tensor]:
        """Prefill rows that continue kept rows (`continued[b]`: the kept row prompt b continues) in the decode slot
        they will decode in: their cached positions copied from the kept slot (masked after each row's reused
        tokens), then each row's new tokens (left-padded) run on top at the columns after them, positions
        continuing (`DecodeSlot.prefill`). Returns the last logits `[B, V]`, the slot, loaded to decode, and the
        mask `[B, W]` of the positions each row attends."""
        rows = torch.tensor(continued, device=device)
        reused = [kept.reused(j) for j in continued]  # the prompt tokens each row's cache already holds
        suffixes = [prompt[n:] for prompt, n in zip(prompts, reused)]
        suffix_ids, suffix_mask = self._left_pad(suffixes, device)
        width = kept.prompt_mask.shape[1] + kept.fed
        generated = torch.tensor([n - len(kept.prompts[j]) for j, n in zip(continued, reused)], device=device)
        cached_mask = torch.cat(
            [kept.prompt_mask[rows], torch.arange(kept.fed, device=device) < generated[:, None]], dim=1
        )
        attention_mask = torch.cat([cached_mask, suffix_mask], dim=1)
        position_ids = kept.positions[rows, None] + generated[:, None] + (suffix_mask.cumsum(-1) - 1).clamp(min=0)
        with record_function("ragen/engine.slot"):
            slot = self._graphs.slot(len(prompts), attention_mask.shape[1] + max_new_tokens, device)
        with record_function("ragen/engine.load"):
            slot.adopt(kept.slot, rows, width)
        return slot.prefill(suffix_ids, attention_mask, position_ids, width), slot, attention_mask


def _cast_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """`model` itself when every floating parameter is `dtype` already, else a copy for inference whose floating
    parameters are cast to `dtype` (tied ones stay tied; no gradients copied; buffers such as rotary frequencies
    keep their dtype, as when loading in `dtype`)."""
    params = [p for p in model.parameters() if p.is_floating_point()]
    if all(p.dtype == dtype for p in params):
        return model
    # deepcopy takes each parameter's copy from the memo: cast straight away, never a full-precision transient
    memo = {id(p): torch.nn.Parameter(p.detach().to(dtype), requires_grad=False) for p in params}
    twin = copy.deepcopy(model, memo)
    twin.requires_grad_(False)
    return twin


def _same_device(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return next(a.parameters()).device == next(b.parameters()).device


def _copy_weights(source: torch.nn.Module, twin: torch.nn.Module) -> None:
    """Overwrite the parameters and buffers of `twin` (a `_cast_copy` of `source`) in place with `source`'s."""
    with torch.no_grad():
        for mine, theirs in zip(twin.parameters(), source.parameters(), strict=True):
            mine.copy_(theirs)
        for mine, theirs in zip(twin.buffers(), source.buffers(), strict=True):
            mine.copy_(theirs)
