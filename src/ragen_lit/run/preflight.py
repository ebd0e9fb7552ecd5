"""The checks `fit` and `warm-start` make before any folder, MLflow store or model exists: installed packages (the
rollout engine's, the loggers'), devices, memory, local paths, the model's shape and the environment's options. A
mistake ends in one line and writes nothing."""

from __future__ import annotations

from pathlib import Path

from ragen_lit.config import Config, EnvConfig, LoggingConfig, RolloutConfig
from ragen_lit.errors import ConfigError


def preflight(cfg: Config) -> None:
    """The checks that need this machine (installed packages, devices, memory, files) and the model's shape, run
    before any folder, MLflow store or model is made, so a mistake ends with one line and writes nothing. Those that
    import nothing heavy come first, and torch is imported only to ask a GPU (`run.bounds.cuda_devices`): a
    mistake of the config is refused in well under a second."""
    import importlib.util

    from ragen_lit.run.bounds import check_machine

    if cfg.rollout.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        from ragen_lit.engines.vllm import VLLM_EXTRA_MESSAGE

        raise ConfigError(VLLM_EXTRA_MESSAGE)
    check_logger_packages(cfg.logging)
    for key in ("path", "critic_path"):
        value = getattr(cfg.model, key)
        if value and _looks_local(value) and not Path(value).expanduser().exists():
            raise ConfigError(f"model.{key}={value!r}: no such folder (a local path; a hub id looks like org/name)")
    check_env(cfg.env, cfg.rollout)
    check_wandb_login(cfg.logging)
    check_machine(cfg)


# the loggers of `logging.loggers` that need a package MLflow's install lacks: the packages (any one serves), each
# logger's name being the extra that installs them
LOGGER_PACKAGES = {"tensorboard": ("tensorboard", "tensorboardX"), "wandb": ("wandb",)}


def check_logger_packages(logging: LoggingConfig) -> None:
    """Each logger `logging.loggers` names has its package installed; a missing one is one line naming its extra."""
    import importlib.util

    for name in logging.loggers:
        packages = LOGGER_PACKAGES.get(name, ())
        if packages and all(importlib.util.find_spec(package) is None for package in packages):
            raise ConfigError(
                f"logging.loggers={logging.loggers!r}: {name} is not installed here; pip install 'ragen_lit[{name}]'"
            )


def check_wandb_login(logging: LoggingConfig) -> None:
    """W&B online (`logging.wandb_mode=online`) needs a login on this machine (`wandb login`, WANDB_API_KEY); without
    one, or with a key that is not one (W&B's own check of its form), `wandb.init` would fail mid-setup, after the
    model loaded. Checked offline: whether a key is configured and well formed, not whether the server takes it (a
    terminal without a key is asked for one, as `wandb login` asks)."""
    if "wandb" not in logging.loggers or logging.wandb_mode != "online":
        return
    import os

    import wandb
    from wandb.errors import AuthenticationError, UsageError

    silent = os.environ.get("WANDB_SILENT")
    os.environ["WANDB_SILENT"] = "true"  # its "API key is configured" line says nothing the run does not
    try:
        wandb.login(verify=False)
    except (UsageError, AuthenticationError) as err:
        raise ConfigError(
            f"logging.wandb_mode=online: {str(err).splitlines()[0]} (run `wandb login` or set WANDB_API_KEY), or "
            "keep logging.wandb_mode=offline and upload the run later with `wandb sync`"
        ) from None
    finally:
        if silent is None:
            os.environ.pop("WANDB_SILENT")
        else:
            os.environ["WANDB_SILENT"] = silent


def _looks_local(path: str) -> bool:
    """A path a hub id cannot be: absolute, home-relative or starting with ./ or ../ (hub ids are name or org/name)."""
    return path.startswith(("/", "~", "./", "../", ".\\", "..\\")) or path in (".", "..") or path.count("/") > 1


def check_env(env: EnvConfig, rollout: RolloutConfig) -> None:
    """Build one env up front so a bad `env.*` value, or one that makes observations no context of `rollout` holds,
    fails before any model is built."""
    from ragen_lit.envs import make_env
    from ragen_lit.run.bounds import check_observations

    try:
        built = make_env(env.name, **env.options)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    try:
        check_observations(env, rollout, built)
    finally:
        built.close()
