"""Batched sampling from a transformers causal LM with a KV cache: the rollout engine for small runs.

One `HFEngine.generate` call sorts the prompts by length (identical prompts end up adjacent), cuts
them into chunks of `max_batch_size` rows, and for each chunk

1. prefills every distinct prompt once (left-padded; position ids from the attention-mask cumsum)
   and copies its cache rows to each rollout sharing it (turn 1 of a group: 16 rollouts, 1 prompt);
   with `share_prefixes`, where prompts share a long prefix without being identical (later turns of a
   group start with the same first prompt), the prefix once and then each row's own suffix, if that
   computes fewer positions;
2. decodes token by token with a transformers KV cache (`DynamicCache`, or `StaticCache` with
   cache="static"), sampling all rows at once (`sample_next_tokens`) and detecting stop tokens /
   stop sequences with tensor ops;
3. drops finished rows from the batch and the cache once a tenth of the rows in it have finished.

With cache="graph" (the default on GPU, see `decode_graphs.py`) step 2 instead copies the prefix
into a preallocated static cache and replays one captured CUDA graph per token with fixed shapes,
keeping finished rows until the chunk is done (step 3 is skipped).

The engine shares the policy module with the trainer, so `sync` only swaps the reference and the
engine always samples from the current weights (token-in/token-out: the ids it returns are the ids
the trainer scores). With `dtype` set where the policy's weights have another dtype (bfloat16 decoding of
float32 training weights), it decodes with a copy of the policy in `dtype` instead, whose weights `sync`
overwrites in place (captured decode graphs stay valid).
"""

from __future__ import annotations

import copy
import importlib.util
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.profiler import record_function
from transformers import Cache, DynamicCache, StaticCache

from ragen_lit.choices import HF_CACHE_MODES
from ragen_lit.engines.base import Generation, SamplingParams, validate_request
from ragen_lit.engines.decode_graphs import DECODE_ATTENTION, DecodeGraphs, DecodeSlot, unsupported_reason
from ragen_lit.models import forward_cache_keyword
from ragen_lit.models.gqa_attention import folded_gqa
from ragen_lit.shapes import round_up

# `pad_widths`: prefill forwards are left-padded to a multiple of this many positions
PREFILL_MULTIPLE = 64

# Dropping finished rows costs one copy of the cache. Measured on 2 busy CPU cores (1 thread; tiny-model
# shape, 128 rows in groups of 16, ~250-token prompts, up to 100 new tokens, rows ending at random),
# median tokens/s dynamic/static cache: never drop 272/332, drop at 50% 308/503, at 25% 446/616,
# at 10% 547/690, at 3% 562/601.
_DROP_FINISHED_FRACTION = 0.1

# `sample_next_tokens(full_vocabulary=...)`: the ways a draw over the whole vocabulary is made
FULL_VOCABULARY_DRAWS = ("inverse_cdf", "gumbel", "philox")

# Tokens tried before a full sort when sampling with top-p alone (see `sample_next_tokens`).
_NUCLEUS_PROBE = 256

# cache="graph": how often (decode steps) the loop asks the device whether every row has stopped.
_FINISHED_CHECK_EVERY = 8


def left_pad(
    prompts: Sequence[Sequence[int]],
    pad_token_id: int,
    device: torch.device,
    multiple: int = 1,
    vocab_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token-id lists into one batch.

    Returns `input_ids: [B, L] long` (pad_token_id on the left) and `attention_mask: [B, L] bool`
    (True on prompt tokens), where L is the longest prompt rounded up to a multiple of `multiple`.
    With `vocab_size`, raises ValueError for an id outside `[0, vocab_size)` (pad_token_id included).
    """
    longest = max(len(p) for p in prompts)
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    width = round_up(longest, multiple)
    attention_mask = torch.arange(width, device=device) >= (width - lengths)[:, None]
    # filled on the host, row by row from the lists, and copied once: 7x faster than one tensor of all the ids put
    # through the mask (which also waited for the device), at 128 rows of ~1.3k ids
    input_ids = np.full((len(prompts), width), pad_token_id, dtype=np.int64)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = prompt
    # checked on the host array, not on the device tensor (reading a device value back would make the host wait for
    # all queued work), nor on the lists: at 128 rows of ~1.7k ids a CPU core took 4 ms over them, 0.1 ms here
    if vocab_size is not None and (input_ids.min() < 0 or input_ids.max() >= vocab_size):
        raise ValueError(f"prompt token ids must be in [0, {vocab_size}), got ids outside that range")
    return torch.from_numpy(input_ids).to(device), attention_mask


def sample_next_tokens(
    logits: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    generator: torch.Generator | None,
    full_vocabulary: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row and return its log-prob under the temperature-scaled distribution.

    `logits: [B, V]`. Temperature 0 is greedy (argmax; log-prob under T = 1). Otherwise the
    candidates are the `top_k` most likely tokens (all if 0), then the smallest prefix of them
    (by descending probability, renormalised over the candidates) whose mass reaches `top_p`;
    a token is drawn from the renormalised candidates. The returned log-prob is
    log_softmax(logits / T) over the full vocabulary, before truncation.

    `full_vocabulary`: how a draw over the whole vocabulary (no top-k, top-p 1) is made, "inverse_cdf"
    (`_inverse_cdf_sample`: one uniform per row, several passes over [B, V] in float32), "gumbel" (`gumbel_max`: V
    uniforms per row drawn into a tensor) or "philox" (`kernels.gumbel`: the Gumbel-max draw in two Triton
    kernels that make their uniforms in registers, from a seed drawn from `generator`; needs a CUDA device or
    Triton's interpreter); None: `default_full_vocabulary_draw`. The same distribution, other draws.

    Returns `token_ids: [B] long`, `logprobs: [B] float32`.
    """
    if full_vocabulary not in (None, *FULL_VOCABULARY_DRAWS):
        raise ValueError(f"full_vocabulary must be None or one of {FULL_VOCABULARY_DRAWS}, got {full_vocabulary!r}")
    vocab_size = logits.shape[-1]
    if temperature != 0 and not 0 < top_k < vocab_size and top_p >= 1:
        method = full_vocabulary or default_full_vocabulary_draw(logits.is_cuda)
        if method == "gumbel":
            uniform = torch.rand(logits.shape, generator=generator, device=logits.device)
            return gumbel_max(logits, uniform, float(temperature))
        if method == "philox":
            from ragen_lit.kernels.gumbel import gumbel_sample  # Triton: CUDA machines (or its interpreter)

            seed = torch.randint(0, 2**62, (1,), generator=generator, device=logits.device)
            return gumbel_sample(logits, float(temperature), seed)
    logits = logits.float()
    if temperature == 0:
        logprobs = torch.log_softmax(logits, dim=-1)
        token_ids = logprobs.argmax(dim=-1)
        return token_ids, logprobs.gather(-1, token_ids[:, None])[:, 0]
    # x / 1.0 == x exactly: skip a pass over [B, V] at the default temperature
    logprobs = torch.log_softmax(logits if temperature == 1 else logits / temperature, dim=-1)
    candidate_logprobs, candidate_ids = logprobs, None
    if 0 < top_k < vocab_size:
        candidate_logprobs, candidate_ids = logprobs.topk(top_k, dim=-1)
        candidate_logprobs = torch.log_softmax(candidate_logprobs, dim=-1)
    elif top_p < 1:
        # A full-vocabulary sort is slow on CPU; the nucleus usually lies inside the most likely few
        # hundred tokens, and when their mass reaches top_p in every row that prefix is exact.
        candidate_logprobs, candidate_ids = logprobs.topk(min(vocab_size, _NUCLEUS_PROBE), dim=-1)
        if bool((candidate_logprobs.exp().sum(dim=-1) < top_p).any()):
            candidate_logprobs, candidate_ids = logprobs.sort(dim=-1, descending=True)
    if top_p < 1:
        candidate_probs = candidate_logprobs.exp()
        mass_before = candidate_probs.cumsum(dim=-1) - candidate_probs
        # The most likely token always has mass_before == 0 < top_p, so no row is emptied.
        candidate_logprobs = candidate_logprobs.masked_fill(mass_before >= top_p, float("-inf"))
    choice = _inverse_cdf_sample(candidate_logprobs.exp(), generator)
    token_ids = choice if candidate_ids is None else candidate_ids.gather(-1, choice[:, None])[:, 0]
    return token_ids, logprobs.gather(-1, token_ids[:, None])[:, 0]


def default_full_vocabulary_draw(is_cuda: bool) -> str:
    """`sample_next_tokens`' draw when none is named: "philox" on CUDA where Triton is installed (PyTorch's CUDA builds
    for Linux bring it), "gumbel" on CUDA without it, "inverse_cdf" elsewhere (V uniforms per row are slow there)."""
    if not is_cuda:
        return "inverse_cdf"
    return "philox" if importlib.util.find_spec("triton") is not None else "gumbel"


def gumbel_max(logits: torch.Tensor, uniform: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A draw from softmax(logits / T) per row by the Gumbel-max trick: argmax(logits / T - log(-log u)) with
    `uniform: [B, V]` i.i.d. in [0, 1); and its log-prob log_softmax(logits / T) at the drawn token (one
    log-sum-exp). The reference of `kernels.gumbel`, which makes its uniforms inside its kernels (CUDA's
    default). Returns `token_ids: [B] long`, `logprobs: [B] float32`."""
    scaled = logits.float() / temperature
    token_ids = (scaled - torch.log(-torch.log(uniform))).argmax(dim=-1)
    chosen = scaled.gather(-1, token_ids[:, None])[:, 0]
    return token_ids, chosen - torch.logsumexp(scaled, dim=-1)


def _inverse_cdf_sample(weights: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draw index i of each row with probability weights[i] / sum(weights) (`weights: [B, V] >= 0`).

    One uniform per row against the cumulative weights: an order of magnitude faster on CPU than
    `torch.multinomial`, which spends V random numbers per row. A zero-weight index is never drawn,
    because the first cumulative weight above u * total has a positive increment.
    """
    cumulative = weights.cumsum(dim=-1)
    uniform = torch.rand(weights.shape[0], 1, generator=generator, device=weights.device)
    index = torch.searchsorted(cumulative, uniform * cumulative[:, -1:], right=True)[:, 0]
    return index.clamp(max=weights.shape[-1] - 1)


def ends_with_stop_sequence(generated: torch.Tensor, stop_sequences: Sequence[torch.Tensor]) -> torch.Tensor:
    """Which rows' generated ids currently end with one of the stop sequences.

    `generated: [B, t] long` (the ids generated so far); each `stop_sequences[j]: [S_j, m_j] long`
    holds all stop sequences of length m_j. Returns `hits: [B] bool`.
    """
    hits = torch.zeros(generated.shape[0], dtype=torch.bool, device=generated.device)
    for sequences in stop_sequences:
        length = sequences.shape[1]
        if length <= generated.shape[1]:
            tail = generated[:, -length:]
            hits |= (tail[:, None, :] == sequences[None]).all(dim=-1).any(dim=-1)
    return hits


@dataclass
class PrefixPlan:
    """How a chunk's prompts share prefixes: `prefixes[k]` is computed once, then row b continues prefix
    `prefix_of[b]` with its own `suffixes[b]` (at least one token)."""

    prefixes: list[list[int]]
    prefix_of: list[int]
    suffixes: list[list[int]]

    def padded_tokens(self) -> int:
        """Positions the two prefill forwards compute: distinct prefixes x the longest, rows x the longest suffix."""
        return len(self.prefixes) * max(map(len, self.prefixes)) + len(self.suffixes) * max(map(len, self.suffixes))


def shared_prefix_plan(prompts: Sequence[list[int]]) -> PrefixPlan:
    """Split the prompts into runs that share a prefix, saving the most prefix tokens.

    In lexicographic order, prompts sharing a prefix are adjacent, and a run of them shares the smallest
    common-prefix length of its neighbours. A run of m prompts sharing p tokens saves (m - 1) * p; the runs
    are chosen by dynamic programming over the sorted order (O(n^2) at most, n = chunk rows; a run grows only while
    its prompts share a token, so about n x the group size for groups that share nothing). Each prompt keeps at
    least its last token as suffix (its logits start the sampling); a run of one has the prompt minus its last
    token as prefix. Example: [1,2,3,4], [1,2,3,5], [9,9] -> prefixes [1,2,3] and [9], suffixes [4], [5], [9].
    """
    order = sorted(range(len(prompts)), key=prompts.__getitem__)
    common = [0] * len(order)  # common[j]: shared prefix length of sorted prompts j - 1 and j
    for j in range(1, len(order)):
        a, b = prompts[order[j - 1]], prompts[order[j]]
        n = min(len(a), len(b))
        common[j] = next((k for k in range(n) if a[k] != b[k]), n)
    # best[j]: the most tokens saved by runs covering sorted prompts 0..j-1; start[j]: where the last run starts
    best, start = [0] * (len(order) + 1), [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        shared = len(prompts[order[j - 1]]) - 1
        best[j], start[j] = best[j - 1], j - 1
        for i in range(j - 2, -1, -1):  # run i..j-1
            shared = min(shared, common[i + 1], len(prompts[order[i]]) - 1)
            if shared == 0:  # and for every longer run, which saves nothing over best[j] >= best[i]
                break
            if best[i] + (j - 1 - i) * shared > best[j]:
                best[j], start[j] = best[i] + (j - 1 - i) * shared, i
    prefixes, prefix_of, suffixes = [], [0] * len(prompts), [[] for _ in prompts]
    j = len(order)
    while j > 0:
        run = order[start[j] : j]
        shared = min([len(prompts[i]) - 1 for i in run] + common[start[j] + 1 : j])
        for i in run:
            prefix_of[i], suffixes[i] = len(prefixes), prompts[i][shared:]
        prefixes.append(prompts[run[0]][:shared])
        j = start[j]
    return PrefixPlan(prefixes, prefix_of, suffixes)


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
        share_prefixes: also compute a prefix that non-identical prompts share once (the later turns of a
            group all start with its first prompt), then each row's own suffix, where that computes fewer
            positions (dynamic and graph caches). The logits equal the plain prefill's up to rounding, so a
            sampled token can differ where a draw falls within rounding of a boundary; off by default, which
            keeps runs bit-identical to those measured before it existed.
        dtype: decode with a copy of the model whose floating parameters are in this dtype, where some of the
            model's are not (None: the model itself). bfloat16 for float32 training weights halves the bytes of
            weights and KV cache every decode step reads; the sampled tokens then follow the bfloat16 model,
            as a vLLM engine in bfloat16 does. Buffers (rotary frequencies) keep their dtype, as when a model
            is loaded in bfloat16.
        pad_widths: left-pad each prefill forward to a multiple of `PREFILL_MULTIPLE` positions (masked; same
            logits), so that a run's prefills repeat their shapes and cuDNN attention reuses the plan it builds
            per shape. None: on a GPU only. (A profiled single-turn generation on an H200 spent ~0.8 s of host
            time in cuDNN attention; on that shape the padding gained nothing measurable: docs/PERFORMANCE.md.)
        decode_attention: the attention kernel of cache="graph"'s steps: sdpa's "auto" (PyTorch's choice, cuDNN on
            Hopper GPUs), "cudnn", "efficient" or "math", or FlexAttention's ("flex"), two matrix products and a
            softmax ("matmul") or flash-decoding's Triton kernels ("split"; all three in `models.decode_attention`).
            Same attention, other kernels.
        compile_decode: cache="graph" runs each one-token step as the whole forward through `torch.compile`
            (`decode_graphs.compiled_step`; same samples), captured like the eager step on a GPU.
        fuse_projections: cache="graph"'s steps run each layer's q, k and v projections as one matrix product, and
            its MLP's gate and up projections as one (`models.fused_projections`): the same products up to summation
            order, from concatenated copies of those weights (for Qwen2.5-0.5B ~0.5 GB in bfloat16) written again at
            every `generate` call. Off by default, as `share_prefixes`.
        reuse_turns: cache="graph" keeps each row's cache after a call, until the next `sync` or `release`: a call
            whose every prompt continues a kept row's prompt and generation, token for token (a rollout's next
            turn), copies those rows' cached positions and prefills only the new tokens (`_KeptRows`). Logits equal
            the full prefill's up to rounding (the kept keys and values were computed by decode steps); off by
            default, as `share_prefixes`. A row's cache keeps the masked positions of earlier turns (padding, the
            steps after its stop), so rows that stop early leave wider caches than a fresh prefill would.
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
        share_prefixes: bool = False,
        dtype: torch.dtype | None = None,
        pad_widths: bool | None = None,
        decode_attention: str = "auto",
        compile_decode: bool = False,
        reuse_turns: bool = False,
        fuse_projections: bool = False,
    ) -> None:
        if not isinstance(pad_token_id, int) or pad_token_id < 0:
            raise ValueError(f"pad_token_id must be an int >= 0, got {pad_token_id!r}")
        if not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ValueError(f"max_batch_size must be an int >= 1, got {max_batch_size!r}")
        if cache not in HF_CACHE_MODES:
            raise ValueError(f"cache must be one of {HF_CACHE_MODES}, got {cache!r}")
        if decode_attention not in DECODE_ATTENTION:
            raise ValueError(f"decode_attention must be one of {tuple(DECODE_ATTENTION)}, got {decode_attention!r}")
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise ValueError(f"dtype must be a floating torch.dtype or None, got {dtype!r}")
        self.dtype = dtype
        self._source: torch.nn.Module | None = None  # the module last synced from
        self._kept: _KeptRows | None = None  # reuse_turns: the last call's rows, until the next sync or release
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
        self.pad_widths = pad_widths
        self.decode_attention = decode_attention
        self.compile_decode = compile_decode
        self.reuse_turns = reuse_turns
        self.fuse_projections = fuse_projections

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
        self, prompts: list[list[int]], max_new_tokens: int, device: torch.device
    ) -> tuple[torch.Tensor, Cache, torch.Tensor, torch.Tensor | None]:
        """Run the prompts (sorted by length) through the model once.

        Returns `last_logits: [B, V]`, the cache, `attention_mask: [B, L] bool` and `copy_index`.
        With dedup on, each run of identical prompts is computed once: the cache then holds one row
        per distinct prompt, and `copy_index: [B]` says which cache row each prompt continues
        (None when the cache has the B rows already). With `share_prefixes`, where prompts share long prefixes
        without being identical (the later turns of a group) and that computes fewer positions, the shared
        prefixes are computed once instead and each row's own suffix after them (`_prefill_shared`; dynamic
        caches only).
        """
        distinct = prompts
        copy_index = None
        if self.dedup_prompts:
            is_new = [True] + [a != b for a, b in itertools.pairwise(prompts)]
            if not all(is_new):
                distinct = [p for p, new in zip(prompts, is_new) if new]
                copy_index = torch.tensor(is_new, device=device).cumsum(0) - 1
        if self.share_prefixes and self.cache != "static":  # a StaticCache is not grown by reorder_cache
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

    def _prefill_multiple(self, device: torch.device) -> int:
        """What prefill widths are rounded up to (`pad_widths`)."""
        pad = self.pad_widths if self.pad_widths is not None else device.type == "cuda"
        return PREFILL_MULTIPLE if pad else 1

    def _vocab_size(self) -> int:
        return self.model.get_input_embeddings().num_embeddings

    def _left_pad(self, prompts: Sequence[Sequence[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """`left_pad` of ids a prefill forward embeds: with the pad id, rounded up to the `pad_widths` multiple, and
        checked against the vocabulary. Every prompt id a call embeds passes here, so `generate` need not check its
        lists (the kept turns' reused ids, which it does not embed, were checked or sampled by the call before)."""
        return left_pad(prompts, self.pad_token_id, device, self._prefill_multiple(device), self._vocab_size())

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
        batch_size, prompt_width = prompt_mask.shape
        max_new_tokens = params.max_new_tokens
        stops = _Stops(params, device)

        # Outputs, indexed by chunk row; `rows` maps each batch row to its chunk row.
        token_ids, logprobs, num_generated, stopped = _output_buffers(batch_size, max_new_tokens, device)

        rows = torch.arange(batch_size, device=device)
        finished = torch.zeros(batch_size, dtype=torch.bool, device=device)
        attention_mask = torch.cat(
            [prompt_mask, torch.ones(batch_size, max_new_tokens, dtype=torch.bool, device=device)], dim=1
        )
        next_position = prompt_mask.sum(-1)
        for step in range(max_new_tokens):
            next_ids, next_logprobs = sample_next_tokens(
                logits, params.temperature, params.top_k, params.top_p, generator
            )
            live_rows = rows[~finished]
            token_ids[live_rows, step] = next_ids[~finished]
            logprobs[live_rows, step] = next_logprobs[~finished]
            newly_stopped = stops.hit(next_ids, token_ids, step, rows) & ~finished
            num_generated[rows[newly_stopped]] = step + 1
            stopped[rows[newly_stopped]] = True
            finished |= newly_stopped
            if step == max_new_tokens - 1 or bool(finished.all()):
                break
            if int(finished.sum()) >= _DROP_FINISHED_FRACTION * finished.numel():
                keep = ~finished
                cache.reorder_cache(keep.nonzero()[:, 0])
                rows, next_ids, next_position = rows[keep], next_ids[keep], next_position[keep]
                attention_mask, finished = attention_mask[keep], finished[keep]
            out = self.model(
                input_ids=next_ids[:, None],
                attention_mask=attention_mask[:, : prompt_width + step + 1],
                position_ids=next_position[:, None],
                use_cache=True,
                **{self._cache_keyword: cache},
            )
            logits = out.logits[:, -1]
            next_position = next_position + 1

        return _generations(token_ids, logprobs, num_generated, stopped)

    def _sample_chunk_fixed(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        device: torch.device,
        generator: torch.Generator | None,
    ) -> list[Generation]:
        """The decode loop of cache="graph": every row stays in the batch until all have stopped
        (a row's tokens after its stop are discarded), so each step has the same shapes and replays
        one captured graph; no step makes the host wait for the device (`_AllStopped` answers a finished-check
        every `_FINISHED_CHECK_EVERY` steps from the check before)."""
        stops = _Stops(params, device)  # host-memory copies, made before the prefill is queued (see _prefill_shared)
        kept, self._kept = self._kept, None
        continued = kept.continued(prompts) if kept is not None else None
        if self._graphs is None:
            self._graphs = DecodeGraphs(
                self.model,
                self.max_batch_size,
                attention=self.decode_attention,
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
        batch_size, prompt_width = prompt_mask.shape
        max_new_tokens = params.max_new_tokens
        positions = prompt_mask.sum(-1)
        self._graphs.refresh()  # the weights may have changed since the last call (an optimizer step)
        token_ids, logprobs, num_generated, finished = _output_buffers(batch_size, max_new_tokens, device)
        all_stopped = _AllStopped(device)
        fed = 0  # decode steps run: the first `fed` sampled tokens of every row have keys and values in the slot
        with record_function("ragen/engine.decode"):
            for step in range(max_new_tokens):
                next_ids, next_logprobs = sample_next_tokens(
                    logits, params.temperature, params.top_k, params.top_p, generator
                )
                token_ids[:, step] = next_ids
                logprobs[:, step] = next_logprobs
                newly_stopped = stops.hit(next_ids, token_ids, step) & ~finished
                num_generated = torch.where(newly_stopped, step + 1, num_generated)
                finished |= newly_stopped
                if step == max_new_tokens - 1:
                    break
                if (step + 1) % _FINISHED_CHECK_EVERY == 0 and all_stopped(finished):
                    break
                logits = slot.step(next_ids, positions + step, prompt_width + step)[:batch_size]
                fed += 1
        with record_function("ragen/engine.outputs"):
            generations = _generations(token_ids, logprobs, num_generated, finished)
        if self.reuse_turns:
            self._kept = _KeptRows(slot, prompts, [g.token_ids for g in generations], prompt_mask, positions, fed)
        return generations

    def _prefill_into_slot(
        self, prompts: list[list[int]], max_new_tokens: int, device: torch.device
    ) -> tuple[torch.Tensor, DecodeSlot, torch.Tensor]:
        """`_prefill`, its cache then loaded into the decode slot of its shape. Same returns as `_prefill_kept`."""
        logits, prefix, prompt_mask, copy_index = self._prefill(prompts, max_new_tokens, device)
        batch_size, prompt_width = prompt_mask.shape
        with record_function("ragen/engine.slot"):
            slot = self._graphs.slot(batch_size, prompt_width + max_new_tokens, device)
        with record_function("ragen/engine.load"):
            slot.load(prefix, copy_index, prompt_mask, prompt_mask.sum(-1))
        return logits, slot, prompt_mask

    def _prefill_kept(
        self, kept: _KeptRows, continued: list[int], prompts: list[list[int]], max_new_tokens: int, device: torch.device
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


class _KeptRows:
    """A graph-cache call's rows, kept for the next call (`reuse_turns`): the slot holding their keys and values
    (columns `[0, W)` the prompt, masked by `prompt_mask [B, W]`; then one column per decode step run, `fed`), and
    each row's prompt and generation. Row b's cache holds its prompt and its first `min(len(generation), fed)`
    sampled tokens, at positions `positions[b]` onward for the sampled ones."""

    def __init__(self, slot, prompts, generations, prompt_mask: torch.Tensor, positions: torch.Tensor, fed: int):
        self.slot, self.prompts, self.generations = slot, prompts, generations
        self.prompt_mask, self.positions, self.fed = prompt_mask, positions, fed
        # rows by (prompt + generation length, its last tokens): a short key, checked in full on a hit; the last
        # tokens come from the two lists' tails, not from a copy of the whole prompt and generation
        self._index: dict[tuple[int, tuple[int, ...]], list[int]] = {}
        for row, (prompt, generation) in enumerate(zip(prompts, generations)):
            tail = (prompt[-_KEY_TOKENS:] + generation[-_KEY_TOKENS:])[-_KEY_TOKENS:]
            self._index.setdefault((len(prompt) + len(generation), tuple(tail)), []).append(row)
        self._lengths = sorted({length for length, _ in self._index})

    def reused(self, row: int) -> int:
        """How many leading tokens of a prompt continuing `row` its cache holds."""
        return len(self.prompts[row]) + min(len(self.generations[row]), self.fed)

    def continued(self, prompts: list[list[int]]) -> list[int] | None:
        """For each prompt, a kept row whose prompt and generation it starts with and continues by at least one
        token; None unless every prompt has one (then the call prefills as usual)."""
        rows = []
        for prompt in prompts:
            row = next(
                (
                    row
                    for length in self._lengths
                    if length < len(prompt)
                    for row in self._index.get((length, tuple(prompt[max(0, length - _KEY_TOKENS) : length])), ())
                    if prompt[: len(self.prompts[row])] == self.prompts[row]
                    and prompt[len(self.prompts[row]) : length] == self.generations[row]
                ),
                None,
            )
            if row is None:
                return None
            rows.append(row)
        return rows


# `_KeptRows`: the trailing tokens of a kept row's prompt and generation that key its lookup
_KEY_TOKENS = 8


class _AllStopped:
    """Whether every row of a decode loop has stopped, asked without making the host wait for the device.

    On a GPU a check queues a copy of `finished.all()` into pinned host memory behind the steps launched so far and
    answers with the previous check's copy, which the device made a check period ago: the host never drains the
    queue, so the device never idles while the host launches the next steps (a synchronous check left it idle
    ~54 ms per multi-turn rollout on an H200: docs/PERFORMANCE.md, session 17). `finished` only grows, so a late
    "all stopped" is still true; the loop runs at most one check period longer, and the steps after a row's stop are
    discarded anyway. Elsewhere the current value, read at once."""

    def __init__(self, device: torch.device):
        self.flag = torch.zeros((), dtype=torch.bool, pin_memory=True) if device.type == "cuda" else None
        self.copied: torch.cuda.Event | None = None

    def __call__(self, finished: torch.Tensor) -> bool:
        if self.flag is None:
            return bool(finished.all())
        answer = False
        if self.copied is not None:
            self.copied.synchronize()
            answer = bool(self.flag)
        self.flag.copy_(finished.all(), non_blocking=True)
        self.copied = torch.cuda.Event()
        self.copied.record()
        return answer


class _Stops:
    """`params`' stop token ids and stop sequences as device tensors (sequences grouped by length)."""

    def __init__(self, params: SamplingParams, device: torch.device):
        self.token_ids = torch.tensor(list(params.stop_token_ids), dtype=torch.long, device=device)
        self.sequences = [
            torch.tensor([list(s) for s in params.stop_sequences if len(s) == length], dtype=torch.long, device=device)
            for length in sorted({len(s) for s in params.stop_sequences})
        ]
        self.longest = max((len(s) for s in params.stop_sequences), default=0)

    def hit(
        self, next_ids: torch.Tensor, generated: torch.Tensor, step: int, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Which rows stop at `step`: `next_ids: [B]` is a stop token, or the ids so far (`generated`,
        `next_ids` included at column `step`; its rows `rows` if given, else all) now end with a stop
        sequence. Returns `[B] bool`."""
        hit = torch.isin(next_ids, self.token_ids)
        if self.sequences:
            columns = slice(max(0, step + 1 - self.longest), step + 1)
            recent = generated[:, columns] if rows is None else generated[rows, columns]
            hit |= ends_with_stop_sequence(recent, self.sequences)
        return hit


def _output_buffers(batch_size: int, max_new_tokens: int, device: torch.device):
    """Per chunk row: sampled ids `[B, N]`, their log-probs `[B, N]`, the count kept (N unless the row
    stops) and whether it stopped."""
    return (
        torch.zeros(batch_size, max_new_tokens, dtype=torch.long, device=device),
        torch.zeros(batch_size, max_new_tokens, dtype=torch.float32, device=device),
        torch.full((batch_size,), max_new_tokens, dtype=torch.long, device=device),
        torch.zeros(batch_size, dtype=torch.bool, device=device),
    )


def _generations(
    token_ids: torch.Tensor, logprobs: torch.Tensor, num_generated: torch.Tensor, stopped: torch.Tensor
) -> list[Generation]:
    """One `Generation` per row: the first `num_generated[b]` ids and log-probs of row b."""
    lengths = num_generated.tolist()
    reasons = ["stop" if s else "length" for s in stopped.tolist()]
    return [
        Generation(token_ids=ids[:n], logprobs=lps[:n], finish_reason=reason)
        for ids, lps, n, reason in zip(token_ids.tolist(), logprobs.tolist(), lengths, reasons)
    ]


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
