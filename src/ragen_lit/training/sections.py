"""The sections of a config that `fit`'s two Lightning objects read: `ModuleSections` for `AgentRLModule`,
`DataSections` for `RolloutDataModule`. Each takes its bundle (`ModuleSections.of(cfg)`), not the whole `Config`."""

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
