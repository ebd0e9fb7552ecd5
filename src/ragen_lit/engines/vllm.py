"""vLLM as the rollout engine, colocated with the trainer in each rank (the TRL colocate pattern).

Pinned to the optional extra `ragen_lit[vllm]`; `import vllm` happens only when a `VLLMEngine` is
built, so this module imports without vLLM. The engine runs in this process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so weights move by reference, never through a socket.

- **Distributed.** When torch.distributed runs with world size > 1, every rank builds its own engine
  with `distributed_executor_backend="external_launcher"`: tensor-parallel size 1, one independent
  engine per rank sampling that rank's env groups. vLLM reuses the default process group (or
  creates a 1-rank one when none exists) and destroys it when the engine shuts down: build the
  engine after the trainer's process group and keep it for the whole run.
- **Weight sync** (`sync`, after every policy update): the trainer's parameters are streamed one by
  one through vLLM's in-place reload (worker `reload_weights`, which calls the model's
  `load_weights` and then re-runs the kernel-format processing that some backends apply to weights,
  e.g. CPU weight packing), as full tensors: FSDP2 `DTensor.full_tensor()`, FSDP1 under
  `summon_full_params(writeback=False)`. Wrapper segments are dropped from the names, a PEFT model's
  LoRA layers are pushed merged (W + (alpha / r) B A, computed per tensor; the model itself is never
  merged, so its base weights stay bit for bit what they were), and the prefix cache is reset.
- **Tied weights** (Qwen2.5-0.5B/1.5B/3B, SmolLM2: `lm_head` shares `embed_tokens.weight`): vLLM's
  reload processes a layer only when a checkpoint tensor addresses it, and the tied head gets none
  (its loader skips `lm_head.*`). Its shared weight is updated in place, but on CPU its post-load
  processing built a kernel object from the old values (a oneDNN matmul handle without AMX, a packed
  copy with AMX), so the logits kept the old head. After every reload, each layer holding a
  parameter shared with another layer runs its own `process_weights_after_loading` again; a
  quantized tied layer, whose processing is not idempotent, is refused with one line.
- **Sleep mode** (CUDA only): `release`, called once a whole rollout is over (not after every turn's
  `generate`), puts vLLM to sleep at level 2: the KV cache and the weights are discarded, not copied to
  host memory as level 1 would, because the next `sync` overwrites every weight before the next
  generation (vLLM keeps the model's buffers, e.g. rotary tables, in host memory). `sync` wakes the
  weights before loading (writing into sleeping weights writes into unmapped memory), `generate` wakes
  the KV cache, and a `generate` after `release` without a `sync` is refused.
- **Log-probs.** vLLM returns `processed_logprobs`: log-softmax of logits / temperature (of the raw
  logits when greedy), which is `Generation.logprobs` exactly when top-k and top-p are off (the
  training and validation settings). With top-k/top-p on they are the log-probs of the truncated,
  renormalised distribution the token was drawn from (logged once as a warning).
- **Versions** (the `vllm` extra: 0.25 to 0.32): the engine calls only what both ends have, with the same meaning
  (read in their sources), so no path depends on the version. Where they differ, nothing here relies on either:
  0.32's `LLM.wake_up` returns whether every allocation is awake again (0.25's returns None); 0.32's worker reloads
  weights under its config (`set_current_vllm_config`), which 0.25's reload of unquantized layers never reads; both
  pause the scheduler at a sleep and resume it only once weights and KV cache are both awake, which `generate`
  ensures before it samples.
- **Stops.** `stop_token_ids` map to vLLM's own (`ignore_eos=True`, so only the ids asked for stop a
  sample, as in the HF engine). vLLM has no token-sequence stop, so multi-token `stop_sequences`
  are found after generation and the sample is cut right after the first one (`finish_reason`
  "stop"); the tokens vLLM generated past it are wasted work, bounded by `max_new_tokens`.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch

from ragen_lit.engines.base import Generation, SamplingParams, validate_request
from ragen_lit.models import DTYPES
from ragen_lit.parallel.collectives import full_tensor, rank_and_world

logger = logging.getLogger(__name__)

VLLM_EXTRA_MESSAGE = "rollout.engine=vllm needs the vllm extra: pip install 'ragen_lit[vllm]'"

# vLLM also takes "auto", which it resolves from the checkpoint.
_DTYPES = (*DTYPES, "auto")

# Segments that wrappers insert into parameter names: FSDP1, activation checkpointing, torch.compile.
_WRAPPER_SEGMENTS = frozenset({"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"})
_PEFT_PREFIX = "base_model.model."

# "org/name" or "name" as the hub spells repository ids.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def vllm_weight_name(name: str) -> str | None:
    """The checkpoint name vLLM's `load_weights` expects for trainer parameter `name`.

    Drops DDP's leading `module.` and the wrapper segments `_fsdp_wrapped_module`,
    `_checkpoint_wrapped_module`, `_orig_mod` wherever they sit; for PEFT names, drops
    `base_model.model.` and `.base_layer`, and keeps the trained copy of a `modules_to_save` module.
    Returns None for what must not be pushed: LoRA adapter tensors (`lora_*`) and the frozen
    `original_module` copy of a `modules_to_save` module.
    """
    parts = name.split(".")
    while parts and parts[0] == "module":
        parts.pop(0)
    parts = [p for p in parts if p not in _WRAPPER_SEGMENTS]
    if any(p.startswith("lora_") or p == "original_module" for p in parts):
        return None
    if "modules_to_save" in parts:
        at = parts.index("modules_to_save")
        del parts[at : at + 2]  # "modules_to_save.<adapter name>"
    cleaned = ".".join(p for p in parts if p != "base_layer")
    return cleaned.removeprefix(_PEFT_PREFIX)


def lora_layers(model: torch.nn.Module) -> dict[int, torch.nn.Module]:
    """{id(base weight): its PEFT LoRA layer} for every LoRA layer of `model` (a module with `base_layer` and
    `get_delta_weight`) whose adapters act in its forward: not disabled, and not merged into the base weight."""
    found = {}
    for module in model.modules():
        base = getattr(module, "base_layer", None)
        if base is None or not callable(getattr(module, "get_delta_weight", None)):
            continue
        if not (module.merged or module.disable_adapters):
            found[id(base.weight)] = module
    return found


def merged_weight(weight: torch.Tensor, layer: torch.nn.Module) -> torch.Tensor:
    """`weight` (the LoRA layer's base weight, [out, in]) plus each active adapter's delta (alpha / r) B A, in
    the weight's dtype: what the layer's forward computes with, as one tensor. A new tensor; nothing is changed."""
    adapters = [a for a in layer.active_adapters if a in layer.lora_A or a in layer.lora_embedding_A]
    with torch.no_grad():  # no yield inside: the grad mode cannot leak into a generator's consumer
        merged = weight.float()
        for adapter in adapters:
            merged = merged + layer.get_delta_weight(adapter).float()
    return merged.to(weight.dtype)


@contextmanager
def _full_weights(model: torch.nn.Module) -> Iterator[None]:
    """Within: FSDP1 parameters are unsharded (changes discarded on exit)."""
    with ExitStack() as stack:
        from torch.distributed.fsdp import FullyShardedDataParallel

        if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
            stack.enter_context(FullyShardedDataParallel.summon_full_params(model, writeback=False))
        yield


def trainer_weights(model: torch.nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield `(vllm_weight_name, full tensor)` for every parameter of `model` to push, one at a time.

    FSDP1 parameters are unsharded for the whole iteration, FSDP2 `DTensor`s are gathered one by
    one, a PEFT LoRA layer's base weight comes merged with its adapters (`merged_weight`) under the
    base model's name.
    Tensors are detached and cast to `dtype` (default: kept); they may alias the live parameters, so
    copy each one before advancing. Every rank of a sharded model must drain the iterator, since
    gathering is collective.
    """
    # Detached tensors instead of torch.no_grad(): grad mode set inside a generator would leak into
    # the consumer's frame at every yield.
    with _full_weights(model):
        adapted = lora_layers(model)
        for name, param in model.named_parameters():
            target = vllm_weight_name(name)
            if target is None:
                continue
            tensor = full_tensor(param.detach())
            if id(param) in adapted:
                tensor = merged_weight(tensor, adapted[id(param)])
            yield target, (tensor if dtype is None else tensor.to(dtype)).contiguous()


def tied_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """`(name, module)` of every module that holds a parameter object another module also holds
    (tied embeddings: `model.embed_tokens` and `lm_head`), in `named_modules` order."""
    holders: dict[int, list[str]] = {}
    modules = dict(model.named_modules(remove_duplicate=False))
    for name, module in modules.items():
        for param in module.parameters(recurse=False):
            holders.setdefault(id(param), []).append(name)
    tied = {name for names in holders.values() if len(set(names)) > 1 for name in names}
    return [(name, module) for name, module in modules.items() if name in tied]


def reprocess_tied_layers(model: torch.nn.Module) -> list[str]:
    """Run in vLLM's worker after `reload_weights`: re-run `process_weights_after_loading` of every
    layer whose weight is shared with another layer, so that kernel objects derived from the weight
    (CPU oneDNN handles, packed copies) follow its new values. Returns the names of those layers.

    Unquantized processing only derives kernel state from the weight and may run again; quantized
    processing rewrites the weight itself, so a tied quantized layer is refused.
    """
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    reprocessed = []
    for name, layer in tied_layers(model):
        method = getattr(layer, "quant_method", None)
        if method is None:
            continue
        if not isinstance(method, (UnquantizedEmbeddingMethod, UnquantizedLinearMethod)):
            raise RuntimeError(
                f"weight sync into vLLM cannot refresh layer {name!r}: its weight is tied to another layer and "
                f"quantized by {type(method).__name__}; serve the policy unquantized or untie its embeddings"
            )
        method.process_weights_after_loading(layer)
        reprocessed.append(name)
    return reprocessed


def stop_sequence_end(token_ids: Sequence[int], stop_sequences: Sequence[Sequence[int]]) -> int | None:
    """Length of `token_ids` cut right after the earliest-ending stop sequence, or None if none occurs.

    E.g. ids [5, 1, 2, 9, 1, 2] with stop sequences [[1, 2]] → 3 (keep [5, 1, 2]).
    """
    for end in range(1, len(token_ids) + 1):
        for sequence in stop_sequences:
            if len(sequence) <= end and list(token_ids[end - len(sequence) : end]) == list(sequence):
                return end
    return None


def _check_model_path(model_path: str) -> None:
    path = Path(model_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"model_path={model_path!r} is a folder without config.json; give a saved HF model folder")
        return
    if path.exists() or not _HUB_ID.match(model_path):
        raise ValueError(
            f"model_path={model_path!r} is neither a saved HF model folder nor a hub id like 'Qwen/Qwen2.5-0.5B'"
        )


class VLLMEngine:
    """The `Engine` over an in-process vLLM `LLM`.

    Args:
        model_path: saved HF model folder (or hub id) vLLM starts from; `sync` then replaces its weights.
        gpu_memory_utilization: fraction of the GPU's total memory vLLM may take (weights + KV
            cache), in (0, 1]; the trainer must fit in the rest.
        enable_sleep_mode: free vLLM's memory between generations (CUDA only; ignored on CPU).
        dtype: vLLM's parameter dtype: bfloat16 | float16 | float32 | auto.
        max_model_len: longest prompt + continuation vLLM serves.
        seed: vLLM's seed (offset by the rank when distributed, so ranks sample differently).
        distributed: use the `external_launcher` executor; default: torch.distributed is
            initialised with world size > 1.
        **llm_kwargs: further `vllm.LLM` arguments (e.g. `enforce_eager`, `kv_cache_memory_bytes`);
            they override the defaults set here.
    """

    def __init__(
        self,
        model_path: str,
        *,
        gpu_memory_utilization: float = 0.3,
        enable_sleep_mode: bool = False,
        dtype: str = "bfloat16",
        max_model_len: int = 4096,
        seed: int = 0,
        distributed: bool | None = None,
        **llm_kwargs: Any,
    ) -> None:
        if (
            isinstance(gpu_memory_utilization, bool)
            or not isinstance(gpu_memory_utilization, (int, float))
            or not (0 < gpu_memory_utilization <= 1)
        ):
            raise ValueError(f"gpu_memory_utilization must be a number in (0, 1], got {gpu_memory_utilization!r}")
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}, got {dtype!r}")
        if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 1:
            raise ValueError(f"max_model_len must be an int >= 1, got {max_model_len!r}")
        _check_model_path(model_path)
        try:
            import vllm
        except ModuleNotFoundError as error:
            if error.name != "vllm":
                raise
            raise ImportError(VLLM_EXTRA_MESSAGE) from error

        self.rank, world_size = rank_and_world()
        self.distributed = world_size > 1 if distributed is None else distributed
        self.sleep_mode = enable_sleep_mode and torch.cuda.is_available()
        if enable_sleep_mode and not self.sleep_mode:
            logger.info("enable_sleep_mode ignored: vLLM sleep mode needs CUDA")
        # In-process engine core: weights pass by reference, and `external_launcher` requires it.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        engine_args: dict[str, Any] = dict(
            gpu_memory_utilization=gpu_memory_utilization,
            enable_sleep_mode=self.sleep_mode,
            dtype=dtype,
            max_model_len=max_model_len,
            seed=seed + self.rank,
            logprobs_mode="processed_logprobs",
            # Token ids in, token ids out: no tokenizer needed, and the model folder may have none.
            skip_tokenizer_init=True,
            # vLLM's memory profiler over-reserves with its large default when sharing a GPU (TRL).
            max_num_batched_tokens=4096,
        )
        if self.distributed:
            engine_args["distributed_executor_backend"] = "external_launcher"
            # The external launcher reads these; Lightning's launcher does not always set RANK.
            os.environ.setdefault("RANK", str(self.rank))
            os.environ.setdefault("LOCAL_RANK", str(torch.cuda.current_device() if torch.cuda.is_available() else 0))
        engine_args.update(llm_kwargs)
        try:
            self.llm = vllm.LLM(model_path, **engine_args)
        except Exception as error:
            raise RuntimeError(
                f"vLLM failed to start for model_path={model_path!r} (gpu_memory_utilization={gpu_memory_utilization}, "
                f"max_model_len={max_model_len}, dtype={dtype}): {type(error).__name__}: {error}"
            ) from error
        self.model_path = model_path
        self.gpu_memory_utilization = gpu_memory_utilization
        self.dtype = self.llm.llm_engine.model_config.dtype
        self._asleep_tags: set[str] = set()
        self._weights_discarded = False
        self._warned_truncated_logprobs = False

    def _wake(self, tags: Sequence[str]) -> None:
        waking = [t for t in tags if t in self._asleep_tags]
        if waking:
            self.llm.wake_up(tags=waking)
            self._asleep_tags.difference_update(waking)

    def sync(self, model: torch.nn.Module) -> None:
        """Load `model`'s current weights into vLLM and reset the prefix cache (collective when sharded)."""
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if self.sleep_mode:
            torch.cuda.empty_cache()
            self._wake(["weights"])
        try:
            self.llm.collective_rpc(
                "reload_weights",
                kwargs={"weights_iterator": trainer_weights(model, self.dtype), "is_checkpoint_format": True},
            )
        except (KeyError, ValueError) as error:
            raise RuntimeError(
                f"weight sync into vLLM failed ({type(error).__name__}: {error}); the policy's parameter names, "
                f"wrappers stripped, must be the checkpoint names of model_path={self.model_path!r}"
            ) from error
        self._weights_discarded = False
        self.llm.apply_model(reprocess_tied_layers)
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache after the weight sync (requests still running)")

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """Sample one continuation per prompt; results come back in the order of `prompts`."""
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm import TokensPrompt

        prompts = validate_request(prompts, params)
        if not prompts:
            return []
        truncating = params.temperature > 0 and (params.top_k > 0 or params.top_p < 1)
        if truncating and not self._warned_truncated_logprobs:
            logger.warning(
                "vLLM log-probs with top_k=%s/top_p=%s are those of the truncated distribution, "
                "not the full one the trainer scores",
                params.top_k,
                params.top_p,
            )
            self._warned_truncated_logprobs = True
        requests = [
            VLLMSamplingParams(
                max_tokens=params.max_new_tokens,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k,
                stop_token_ids=list(params.stop_token_ids),
                ignore_eos=True,
                logprobs=0,
                detokenize=False,
                # One seed per request: identical prompts of a group must still differ.
                seed=None if params.seed is None else params.seed + i,
            )
            for i in range(len(prompts))
        ]
        if self._weights_discarded:
            raise RuntimeError("VLLMEngine.generate after release() needs a sync() first: the weights were discarded")
        self._wake(["weights", "kv_cache"])
        try:
            outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], requests, use_tqdm=False)
        except torch.OutOfMemoryError as error:
            raise RuntimeError(
                f"out of memory while vLLM generated {len(prompts)} sequences; lower vLLM's batch size "
                f"(max_num_seqs, default 256) or gpu_memory_utilization (now {self.gpu_memory_utilization})"
            ) from error
        return [self._to_generation(output.outputs[0], params) for output in outputs]

    def release(self) -> None:
        """Free vLLM's GPU memory until the next `sync` (sleep mode on CUDA; nothing otherwise).

        Level 2 discards the weights instead of copying them to host memory (level 1): `sync` rewrites every
        one of them before vLLM samples again, so the copy would be wasted transfer and host memory."""
        if self.sleep_mode and not self._asleep_tags:
            self.llm.sleep(level=2)
            self._asleep_tags = {"weights", "kv_cache"}
            self._weights_discarded = True

    @staticmethod
    def _to_generation(completion: Any, params: SamplingParams) -> Generation:
        token_ids = list(completion.token_ids)
        logprobs = [step[token].logprob for step, token in zip(completion.logprobs, token_ids)]
        if completion.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM finished a sample with {completion.finish_reason!r}; expected stop or length")
        finish_reason = completion.finish_reason
        end = stop_sequence_end(token_ids, params.stop_sequences) if params.stop_sequences else None
        if end is not None:
            token_ids, logprobs, finish_reason = token_ids[:end], logprobs[:end], "stop"
        return Generation(token_ids=token_ids, logprobs=logprobs, finish_reason=finish_reason)
