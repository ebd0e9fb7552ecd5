"""The bounds of this machine, of the model and of the environment, checked by `fit`, `warm-start` and `evaluate`
before any folder, store or model is made (`run.preflight`), so that a size this machine cannot hold is refused in one
line naming the key and what is allowed:

- threads and devices: no more than this machine has;
- the episodes of one iteration (`rollout.groups` x `rollout.group_size` rollouts, times `algo.max_sampling_rounds`
  with dynamic sampling, or `validation.num_envs`), each up to `rollout.max_context_tokens` tokens, held on the host
  at `HOST_BYTES_PER_TOKEN`, fit in the memory available now (`host_episodes`: the same bound holds `evaluate`'s
  episodes x samples);
- where the model's `config.json` is on this machine without a download (a preset, a local folder, the hub cache):
  the context fits the model's window (`max_position_embeddings`), a generation batch's key/value cache
  (min(`rollout.max_batch_size`, rollouts) sequences of up to the context, at the engine's dtype) and a cross-scorer
  forward (`diagnostics.max_tokens_per_forward` tokens) fit in the device's memory (the GPU's, capped at
  `trainer.gpu_memory_fraction`; on a CPU the host's available memory), and a LoRA rank is at most the model's width;
- an env built from the `env` section (`check_observations`): its longest observation (its observation space's
  `max_length`, set by options such as a map's size) fits in the context at `CHARS_PER_TOKEN`.

The memory bounds are the worst case the config allows (every episode filling its context), so a run that passes
cannot run out of memory for these reasons, whatever its episodes do. The bounds that need no machine (a turn's
answer inside the context, a run folder inside `logging.output_dir`) are the config's own cross-field rules
(`config.checks.check_bounds`): `config`, `sweep` and `fit` refuse them alike.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ragen_lit.config import AlgoConfig, Config, EnvConfig, RolloutConfig, ValidationConfig
from ragen_lit.errors import ConfigError

HOST_BYTES_PER_TOKEN = 64
"""host memory per token of an iteration's episodes: the ids the rollout loop keeps (Python ints, ~36 bytes each) and
the batch's tensors built from them (ids, masks, old and reference log-probs, advantages, returns and values)"""
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GIB = 1024**3
CHARS_PER_TOKEN = 16
"""the most characters a token of the context is taken to cover on average (English text averages about 4, the
tiny model's tokenizer on env text less): an observation longer than the context times this cannot fit in it"""


@dataclass(frozen=True)
class ModelShape:
    """What the memory bounds read from a model's `config.json` (None where it does not say)."""

    source: Path
    window: int | None
    layers: int
    kv_heads: int
    head_dim: int
    hidden: int

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Keys and values of one token in every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


def model_shape(model) -> ModelShape | None:
    """The shape of the model `model` (a `ModelConfig`) loads, where its `config.json` is on this machine without a
    download or a conversion; None otherwise (the model-bound checks are then left to the load)."""
    path = _config_file(model)
    if path is None:
        return None
    try:
        config = json.loads(path.read_text())
        text = config.get("text_config") or config  # multimodal configs nest the language model's
        heads = text["num_attention_heads"]
        hidden = text["hidden_size"]
        return ModelShape(
            source=path,
            window=text.get("max_position_embeddings"),
            layers=text["num_hidden_layers"],
            kv_heads=text.get("num_key_value_heads") or heads,
            head_dim=text.get("head_dim") or hidden // heads,
            hidden=hidden,
        )
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None


def _config_file(model) -> Path | None:
    if model.path:
        local = Path(model.path).expanduser()
        if local.is_dir():
            found = local / "config.json"
            return found if found.is_file() else None
        from huggingface_hub import try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(model.path, "config.json")
        except Exception:  # not a valid hub id: the load says so in its own words
            return None
        return Path(cached) if isinstance(cached, str) else None
    if model.name == "tiny":
        from ragen_lit.presets.tiny import shipped_folder

        return shipped_folder() / "config.json"
    if model.name == "smollm2-135m":
        from ragen_lit.presets.cache import default_cache_dir
        from ragen_lit.presets.smollm2 import FOLDER_NAME

        found = default_cache_dir() / FOLDER_NAME / "config.json"
        return found if found.is_file() else None
    return None


def check_machine(cfg: Config) -> None:
    """The bounds of this machine and the model (module docstring); raises ConfigError. The bounds that need no GPU
    fact come first, and the GPUs are counted without torch where it cannot see one (`cuda_devices`), so that a
    refusal on a machine without a GPU comes before torch is imported."""
    t = cfg.trainer
    cores = os.cpu_count() or 1
    if t.threads > cores:
        raise ConfigError(f"trainer.threads={t.threads}: this machine has {cores} CPU cores; use at most {cores}")
    shape = model_shape(cfg.model)
    if shape is not None and shape.window is not None and cfg.rollout.max_context_tokens > shape.window:
        raise ConfigError(
            f"rollout.max_context_tokens={cfg.rollout.max_context_tokens} exceeds the model's context window "
            f"(max_position_embeddings={shape.window} in {shape.source}); use at most {shape.window}"
        )
    host = available_memory()
    _check_episodes(cfg.rollout, cfg.algo, cfg.validation, host)
    if shape is not None and cfg.model.lora.r > shape.hidden:
        raise ConfigError(
            f"model.lora.r={cfg.model.lora.r} exceeds the model's width (hidden_size={shape.hidden} in "
            f"{shape.source}): an adapter's rank is at most its layer's smaller side; use at most {shape.hidden}"
        )
    gpus = cuda_devices() if t.accelerator in ("gpu", "cuda", "auto") else 0
    if t.accelerator in ("gpu", "cuda") and not gpus:
        raise ConfigError(
            f"trainer.accelerator={t.accelerator} but this machine has no usable CUDA GPU; use trainer.accelerator=cpu "
            "or auto"
        )
    on_gpu = gpus > 0
    have = gpus if on_gpu else cores
    if isinstance(t.devices, int) and t.devices > have:
        what = f"{have} GPU{'s' if have != 1 else ''}" if on_gpu else f"{have} CPU cores"
        raise ConfigError(f"trainer.devices={t.devices}: this machine has {what}; use at most {have}")
    if shape is None:
        return
    if on_gpu:
        import torch

        device = torch.cuda.get_device_properties(0).total_memory
        memory, where = device * (t.gpu_memory_fraction or 1.0), "of its GPU's memory"
    else:
        memory, where = host, "of host memory available"
    _check_device_batches(cfg, shape, memory, where, on_gpu)


def cuda_devices() -> int:
    """The CUDA devices torch sees here (`torch.cuda.device_count()` where `torch.cuda.is_available()`). A process
    that has not imported torch (which takes seconds) imports it only where it can see one: a torch built without
    CUDA or ROCm sees none (its `torch/version.py` says so), and neither does a CUDA build on a machine whose NVIDIA
    driver library does not load."""
    if "torch" not in sys.modules:
        build = _torch_gpu_build()
        if build is None:
            return 0
        if build == "cuda":
            import ctypes

            try:
                ctypes.CDLL("libcuda.so.1")
            except OSError:
                return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _torch_gpu_build() -> str | None:
    """`cuda` or `hip` for a torch built with that GPU runtime, None for a CPU build, read from the assignments of
    its `version.py`; `cuda` where the file cannot be read (torch is then asked)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("torch")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    try:
        tree = ast.parse((Path(locations[0]) / "version.py").read_text())
    except (IndexError, OSError, SyntaxError, ValueError):
        return "cuda"
    built = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign):
            target = node.target
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        else:
            continue
        if isinstance(target, ast.Name) and isinstance(node.value, ast.Constant):
            built[target.id] = node.value.value
    if "cuda" not in built or "hip" not in built:
        return "cuda"
    return "cuda" if built.get("cuda") else "hip" if built.get("hip") else None


def available_memory() -> int:
    """Bytes of host memory a new allocation can take now: the kernel's MemAvailable, within the container's cgroup
    limit where there is one (Linux); elsewhere the free pages."""
    try:
        meminfo = Path("/proc/meminfo").read_text()
        available = int(meminfo.split("MemAvailable:")[1].split()[0]) * 1024
    except (OSError, IndexError, ValueError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        limit = int(Path("/sys/fs/cgroup/memory.max").read_text())
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
    except (OSError, ValueError):  # no cgroup v2 limit ("max")
        return available
    return min(available, limit - used)


def _rollouts(rollout: RolloutConfig, algo: AlgoConfig) -> int:
    """Episodes generated in one iteration (every sampling round's, with dynamic sampling)."""
    rounds = algo.max_sampling_rounds if algo.dynamic_sampling else 1
    return rollout.groups * rollout.group_size * rounds


def host_episodes(rollout: RolloutConfig, memory: int) -> int:
    """How many episodes of up to `rollout.max_context_tokens` tokens `memory` bytes of host memory hold."""
    return memory // (rollout.max_context_tokens * HOST_BYTES_PER_TOKEN)


def host_need(rollout: RolloutConfig, episodes: int, memory: int) -> str:
    """`<episodes> episodes of up to rollout.max_context_tokens=<n> tokens need up to <GiB> of host memory and this
    machine has <GiB> available`: the reason of a refusal by `host_episodes`."""
    context = rollout.max_context_tokens
    need = _gib(episodes * context * HOST_BYTES_PER_TOKEN)
    return (
        f"{episodes} episodes of up to rollout.max_context_tokens={context} tokens need up to {need} of host memory "
        f"and this machine has {_gib(memory)} available"
    )


def _check_episodes(r: RolloutConfig, algo: AlgoConfig, validation: ValidationConfig, memory: int) -> None:
    fit = host_episodes(r, memory)
    rollouts = _rollouts(r, algo)
    per_group = rollouts // r.groups
    if rollouts > fit:
        rounds = f" x algo.max_sampling_rounds={algo.max_sampling_rounds}" if algo.dynamic_sampling else ""
        rounds_per_group = per_group // r.group_size
        if fit >= per_group:
            allowed = f"at most rollout.groups={fit // per_group} fits with the other settings"
        elif fit >= rounds_per_group:
            allowed = f"not one group fits: at most rollout.group_size={fit // rounds_per_group} (one group)"
        else:
            most = memory // rounds_per_group // HOST_BYTES_PER_TOKEN
            allowed = f"not one episode fits: at most rollout.max_context_tokens={most}"
        raise ConfigError(
            f"rollout.groups={r.groups} x rollout.group_size={r.group_size}{rounds} = "
            f"{host_need(r, rollouts, memory)}; {allowed}"
        )
    if validation.num_envs > fit:
        raise ConfigError(f"validation.num_envs={host_need(r, validation.num_envs, memory)}; use at most {fit}")


def _gib(size: float) -> str:
    gib = size / GIB
    return f"{gib:,.0f} GiB" if gib >= 100 else f"{gib:.3g} GiB"


def _check_device_batches(cfg: Config, shape: ModelShape, memory: float, where: str, on_gpu: bool) -> None:
    r = cfg.rollout
    dtype = r.dtype or cfg.model.dtype
    if dtype == "auto":
        dtype = "bfloat16" if on_gpu else "float32"
    per_token = shape.kv_bytes_per_token(DTYPE_BYTES[dtype])
    per_sequence = r.max_context_tokens * per_token
    batch = min(r.max_batch_size, max(_rollouts(r, cfg.algo), cfg.validation.num_envs))
    if batch * per_sequence > memory:
        fit = int(memory // per_sequence)
        allowed = (
            f"at most rollout.max_batch_size={fit} fits"
            if fit >= 1
            else f"not even one sequence fits: lower rollout.max_context_tokens to at most {int(memory // per_token)}"
        )
        raise ConfigError(
            f"rollout.max_batch_size={r.max_batch_size}: a generation batch of {batch} sequences of up to "
            f"rollout.max_context_tokens={r.max_context_tokens} tokens holds {_gib(batch * per_sequence)} "
            f"of keys and values ({dtype}) and this machine has {_gib(memory)} {where}; {allowed}"
        )
    scorer = cfg.diagnostics.max_tokens_per_forward
    if scorer and scorer * per_token > memory:
        raise ConfigError(
            f"diagnostics.max_tokens_per_forward={scorer} tokens hold {_gib(scorer * per_token)} of keys and "
            f"values ({dtype}) in one cross-scorer forward and this machine has {_gib(memory)} {where}; use "
            f"at most {int(memory // per_token)} (or 0 for auto)"
        )


def check_observations(env: EnvConfig, rollout: RolloutConfig, built) -> None:
    """The env `built` from `env` shows observations that fit in `rollout`'s context; raises ConfigError."""
    longest, context = built.observation_space.max_length, rollout.max_context_tokens
    if longest > context * CHARS_PER_TOKEN:
        options = ", ".join(f"env.options.{key}={value!r}" for key, value in env.options.items()) or "its options"
        raise ConfigError(
            f"{options}: env.name={env.name} then shows observations of up to {longest:,} characters, more than "
            f"rollout.max_context_tokens={context} tokens hold (at {CHARS_PER_TOKEN} characters a token at most); "
            "make the env smaller or the context longer"
        )
