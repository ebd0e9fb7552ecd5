"""The options of `python -m ragen_lit warm-start` (`training.warm_start`), in a module of their own: the command line
makes its flags from them before it knows whether it will train, so they import nothing heavy (nor does the empty
`training/__init__.py`)."""

from __future__ import annotations

from dataclasses import dataclass

from ragen_lit.config.typed_fields import checked


@dataclass(frozen=True)
class WarmStartOptions:
    """The options of `python -m ragen_lit warm-start`; each field is the flag `--<name with dashes>`. The defaults
    are what worked for SmolLM2-135M-Instruct on an H200 (docs/REPRODUCTION.md: 400 steps at lr 1e-4 took FrozenLake
    to 68.8% and Sokoban to 26.6% in about 90 s, twice what lr 3e-5 reached); a larger model likely wants a smaller
    lr."""

    out: str
    """the model folder to write (new or empty)"""
    episodes: int = checked(1000, ge=1)
    """expert episodes to train on"""
    steps: int = checked(400, ge=1)
    """AdamW steps (linear warm-up over 10, cosine decay to 10% of --lr)"""
    lr: float = checked(1e-4, gt=0.0)
    """peak learning rate"""
    batch_size: int = checked(8, ge=1)
    """episodes per step"""
    epsilon: float = checked(0.45, ge=0.0, le=1.0)
    """probability per turn that the expert plays one random move and says so (the tiny model's recipe)"""
    val_envs: int = checked(32, ge=0)
    """validation episodes before and after the SFT (the config's validation seeds and temperature; 0 skips)"""
    seed: int = 0
    """seed of the expert's random moves, the batch order and the validation sampling"""
