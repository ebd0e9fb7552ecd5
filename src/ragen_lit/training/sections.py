"""The sections of a config that the training room's entries read: `ModuleSections` for `AgentRLModule`,
`DataSections` for `RolloutDataModule` (the two Lightning objects of `fit`), `WarmStartSections` for `warm_start`.
Each takes its bundle (`ModuleSections.of(cfg)`), not the whole `Config`."""

from __future__ import annotations

from dataclasses import dataclass

from ragen_lit.config import (
    AlgoConfig,
    DiagnosticsConfig,
    EnvConfig,
    FilterConfig,
    ModelConfig,
    OptimConfig,
    RolloutConfig,
    Sections,
    TrainerConfig,
    ValidationConfig,
)


@dataclass(frozen=True)
class ModuleSections(Sections):
    """What `AgentRLModule` reads: the models it builds (`model`), how they score and update (`rollout`'s
    temperature and group size, `filter`'s score and keep-rate scaling, `algo`, `optim`), the collapse diagnostics
    and their schedule (`diagnostics`), and where and how long it trains (`trainer`: accelerator, FSDP dtypes,
    iterations, the GPU memory cap)."""

    model: ModelConfig
    rollout: RolloutConfig
    filter: FilterConfig
    algo: AlgoConfig
    optim: OptimConfig
    diagnostics: DiagnosticsConfig
    trainer: TrainerConfig


@dataclass(frozen=True)
class DataSections(Sections):
    """What `RolloutDataModule` reads: the engine's model (`model`), the env and its episodes (`env`, `rollout`),
    the filter and the mini-batches it leaves (`filter`, `algo`, `optim`), and the run's seed (`trainer.seed`)."""

    model: ModelConfig
    env: EnvConfig
    rollout: RolloutConfig
    filter: FilterConfig
    algo: AlgoConfig
    optim: OptimConfig
    trainer: TrainerConfig


@dataclass(frozen=True)
class WarmStartSections(Sections):
    """What `warm_start` reads: the model it fine-tunes (`model`), the env the expert plays with its episode limits
    (`env`, `rollout`), the seeds and temperature it validates at (`validation`), the device and threads
    (`trainer`)."""

    model: ModelConfig
    env: EnvConfig
    rollout: RolloutConfig
    validation: ValidationConfig
    trainer: TrainerConfig
