"""The cross-field rules of a config, after every field's own checks: one `ConfigError` line for the first that
fails."""

from __future__ import annotations

from ragen_lit.choices import filter_value_error, uses_critic
from ragen_lit.config.chat_templates import chat_template_source
from ragen_lit.config.sections import SECTIONS, AlgoConfig, Config, EnvConfig, LoggingConfig, LoraConfig
from ragen_lit.config.typed_fields import check_fields
from ragen_lit.envs import ENV_CLASSES, has_state_key
from ragen_lit.errors import ConfigError

# MLflow tracking-URI schemes the project accepts ("" = a plain local path, MLflow's file store)
TRACKING_SCHEMES = ("", "sqlite", "file", "http", "https", "databricks", "postgresql", "mysql", "mssql")
# those of a tracking server (`logging.tracking_server`)
SERVER_SCHEMES = ("http", "https")

# the shortest context that holds an environment's first prompt and one turn's answer
MIN_CONTEXT_TOKENS = 256

# vllm.LLM arguments the vLLM engine sets itself, which rollout.vllm_args must not override -> why
VLLM_ENGINE_ARGS = {
    "model": "set model.path",
    "gpu_memory_utilization": "set rollout.gpu_memory_utilization",
    "enable_sleep_mode": "set rollout.sleep_mode",
    "dtype": "set rollout.dtype",
    "max_model_len": "set rollout.max_context_tokens",
    "seed": "the engine seeds vLLM from trainer.seed, offset by the rank",
    "logprobs_mode": "the rollout's log-probs must be those of the processed logits the trainer scores",
    "skip_tokenizer_init": "the engine sends and receives token ids only",
    "distributed_executor_backend": "the engine picks it from torch.distributed (external_launcher over ranks)",
}


def validate(cfg: Config) -> Config:
    """Range/choice checks on every field plus the cross-field rules; raises ConfigError."""
    for section in SECTIONS:
        check_fields(getattr(cfg, section), lambda name, section=section: f"{section}.{name}")
    _check_anchor_states(cfg.algo, cfg.env)
    flt = cfg.filter
    if flt.level == "trajectory":
        # `select_trajectories` keeps the top and bottom filter.value share of every group's rollouts, the one
        # rule of that level (Table 7); a group strategy given with it would be silently ignored
        if flt.strategy != "top_p":
            raise ConfigError(
                f"filter.strategy={flt.strategy!r} does not apply at filter.level=trajectory, which keeps the "
                "top and bottom filter.value share of each group's rollouts; leave filter.strategy=top_p (the "
                "default) or use filter.level=group"
            )
    value_error = filter_value_error(flt.strategy, flt.value, flt.level)
    if value_error is not None:
        raise ConfigError(value_error)
    if not uses_critic(cfg.algo.advantage) and cfg.rollout.group_size < 2:
        raise ConfigError(
            f"algo.advantage={cfg.algo.advantage} with rollout.group_size={cfg.rollout.group_size}: a group-relative "
            "advantage compares a rollout with the rest of its group, so with one rollout every advantage is 0 and "
            "only the entropy bonus would train the policy (it drifts to high entropy); use rollout.group_size >= 2, "
            "or algo=ppo (a critic's baseline)"
        )
    if cfg.algo.dynamic_sampling and cfg.rollout.group_size < 2:
        raise ConfigError(
            f"algo.dynamic_sampling=true with rollout.group_size={cfg.rollout.group_size}: a group of one rollout "
            "never has reward variance, so no round could fill the batch; use rollout.group_size >= 2"
        )
    _check_lora(cfg.model.lora, cfg.trainer.strategy)
    if cfg.model.name == "hf" and not cfg.model.path:
        raise ConfigError("model.name=hf needs model.path=<HF id or local folder>")
    chat_template_source(cfg.model.chat_template)  # a missing file or one that is not Jinja: one line, now
    if cfg.trainer.devices != "auto" and not (isinstance(cfg.trainer.devices, int) and cfg.trainer.devices >= 1):
        raise ConfigError(f"trainer.devices={cfg.trainer.devices!r} must be a positive integer or 'auto'")
    t = cfg.trainer
    for key in ("fsdp_param_dtype", "fsdp_reduce_dtype"):
        if getattr(t, key) is not None and t.strategy != "fsdp":
            raise ConfigError(f"trainer.{key}={getattr(t, key)!r} needs trainer.strategy=fsdp (now {t.strategy})")
    if cfg.rollout.max_context_tokens < MIN_CONTEXT_TOKENS:
        raise ConfigError(
            f"rollout.max_context_tokens={cfg.rollout.max_context_tokens} is below {MIN_CONTEXT_TOKENS}, the least "
            "that holds an environment's first prompt and one turn's answer (every episode would end truncated)"
        )
    _check_vllm_args(cfg.rollout.vllm_args)
    _check_tracking(cfg.logging)
    if not cfg.logging.experiment.strip():
        raise ConfigError(f"logging.experiment={cfg.logging.experiment!r} is empty; give the MLflow experiment a name")
    loggers = cfg.logging.loggers
    if "mlflow" not in loggers:
        raise ConfigError(
            f"logging.loggers={loggers!r} leaves out mlflow, the run's record (run.json names its MLflow run; resume "
            f"and compare read it); keep it in the list: logging.loggers=[{','.join(['mlflow', *loggers])}]"
        )
    if len(cfg.optim.betas) != 2 or not all(0.0 <= b < 1.0 for b in cfg.optim.betas):
        raise ConfigError(f"optim.betas={cfg.optim.betas!r} must be two numbers in [0, 1)")
    if cfg.optim.padding_free and cfg.optim.pad_to_multiple > 1:
        raise ConfigError(
            f"optim.pad_to_multiple={cfg.optim.pad_to_multiple} pads rows that optim.padding_free=true packs without "
            "padding; use one of them (pad_to_multiple=0 leaves it to padding_free)"
        )
    check_bounds(cfg)
    return cfg


def check_bounds(cfg: Config) -> None:
    """The bounds a config keeps beyond each field's own range that need no machine (those of this machine, the model
    and an env's observations are `run.bounds`'): a turn's answer inside the context, and a run folder inside
    `logging.output_dir`; raises ConfigError."""
    r = cfg.rollout
    if r.max_new_tokens >= r.max_context_tokens:
        raise ConfigError(
            f"rollout.max_new_tokens={r.max_new_tokens} must be below rollout.max_context_tokens="
            f"{r.max_context_tokens}: a turn's answer and the conversation before it share the context"
        )
    output_dir = cfg.logging.output_dir
    if not output_dir.strip():
        raise ConfigError(
            f"logging.output_dir={output_dir!r} is empty; name the folder runs are written under (default: runs)"
        )
    name = cfg.logging.run_name
    if name is not None and (name.strip() in (".", "..") or any(c in name for c in "/\\\0")):
        raise ConfigError(
            f"logging.run_name={name!r} must be a plain name (no '/' or '\\', not '.' or '..'): it names the run's "
            "folder inside logging.output_dir"
        )


def _check_vllm_args(args: dict) -> None:
    """`rollout.vllm_args`: vllm.LLM keyword arguments, none of those the engine sets from other keys."""
    for key in args:
        if not isinstance(key, str) or not key.isidentifier():
            raise ConfigError(f"rollout.vllm_args: {key!r} is not a vllm.LLM argument name")
        if key in VLLM_ENGINE_ARGS:
            raise ConfigError(f"rollout.vllm_args.{key} is set by the vLLM engine itself: {VLLM_ENGINE_ARGS[key]}")


def _check_tracking(logging: LoggingConfig) -> None:
    """`logging.tracking_uri` is an MLflow store; `logging.tracking_server` an http(s) server in front of the store
    `logging.tracking_uri` names (the run records that store, so it must be one and not another server)."""
    from urllib.parse import urlparse

    uri, server = logging.tracking_uri, logging.tracking_server
    scheme = urlparse(uri).scheme.split("+")[0] if uri is not None else None  # postgresql+psycopg2 -> postgresql
    if scheme is not None and scheme not in TRACKING_SCHEMES:
        raise ConfigError(
            f"logging.tracking_uri={uri!r} is not an MLflow store; use sqlite:///<file>, file:<folder>, "
            "http(s)://<server>, databricks, a database URL (postgresql, mysql, mssql) or a local path"
        )
    if server is None:
        return
    if urlparse(server).scheme not in SERVER_SCHEMES or not urlparse(server).netloc:
        raise ConfigError(
            f"logging.tracking_server={server!r} is not an MLflow server's address; give http(s)://<host>:<port>, or "
            "null to write to logging.tracking_uri's store directly"
        )
    if uri is None or scheme in SERVER_SCHEMES:
        what = "is not set" if uri is None else f"={uri!r} is a server itself"
        raise ConfigError(
            f"logging.tracking_server={server!r} writes to the store logging.tracking_uri names, and "
            f"logging.tracking_uri {what}; set it to that store (e.g. sqlite:///<file>), or drop "
            "logging.tracking_server"
        )


def _check_lora(lora: LoraConfig, strategy: str) -> None:
    """`model.lora`: names of modules to adapt, and no FSDP (`trainer.strategy`: its flat shards would mix frozen and
    trained weights)."""
    targets = lora.target_modules
    if not targets or not all(isinstance(t, str) and t.strip() for t in targets):
        raise ConfigError(
            f"model.lora.target_modules={targets!r} must be a non-empty list of module names (e.g. [q_proj, v_proj]) "
            "or [all-linear]"
        )
    if "all-linear" in targets and len(targets) > 1:
        raise ConfigError(
            f"model.lora.target_modules={targets!r}: all-linear already names every linear layer; give it alone"
        )
    if lora.r > 0 and strategy == "fsdp":
        raise ConfigError(
            f"model.lora.r={lora.r} with trainer.strategy=fsdp is not supported (FSDP would shard the frozen base "
            "weights with the adapters); use trainer.strategy=ddp, or model.lora.r=0 for full fine-tuning under FSDP"
        )


def _check_anchor_states(algo: AlgoConfig, env: EnvConfig) -> None:
    """`algo.advantage=gigpo` groups steps by identical env states: the env must say what that means."""
    if algo.advantage != "gigpo":
        return
    env_class = ENV_CLASSES.get(str(env.name).lower())
    if env_class is not None and not has_state_key(env_class):
        with_keys = ", ".join(name for name, cls in sorted(ENV_CLASSES.items()) if has_state_key(cls))
        raise ConfigError(
            f"algo.advantage=gigpo needs anchor states, and env.name={env.name} has no state_key to say which "
            f"states are identical; use an env that has one ({with_keys}) or another algo.advantage"
        )
