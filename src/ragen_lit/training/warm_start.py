"""`python -m ragen_lit warm-start`: supervised fine-tuning of a causal LM on the scripted expert's episodes of
the config's env, saved as a model folder that `fit` continues from (`model.name=hf model.path=FOLDER`).

Why: GRPO and PPO learn from differences between a group's rewards. An instruct LM that has never seen the
env's protocol gets the same reward in every rollout: SmolLM2-135M-Instruct writes
`<think>…</think><answer>…</answer>` in about 1% of FrozenLake turns and never a valid action, so every
group's reward variance is 0 and RL gets no signal. The tiny model starts from the same kind of warm start
(`presets/tiny/build.py`); this command gives it to any model.

Steps:
1. the config is loaded as `fit` loads it; the model (a preset or `model.path`) and its tokenizer and chat
   template are resolved as `fit` resolves them;
2. the expert (`presets/tiny/expert.py`, one random move with probability `epsilon` per turn, which leaves the
   imitating policy room for RL, as in the tiny model's recipe) plays `episodes` episodes of the config's env
   with its options and rollout limits, rendered through the model's own chat template
   (`presets/expert_episodes.py`), from seed 6,000,000 on: far from validation and RL training seeds;
3. the model trains `steps` AdamW steps on the sampled tokens (`presets/sft.py`) in float32 parameters (AdamW's
   small updates round away in bfloat16 ones), computing in bfloat16 under autocast on a GPU;
4. before and after, `val_envs` validation episodes (the config's validation seeds and temperature, decoded in
   `rollout.dtype` as `fit` decodes) measure success, the format-valid and the valid-action turn rates;
5. model, tokenizer and `warm_start.json` (the record) are written beside `out` and renamed into place.

Full fine-tuning whatever `model.lora` says; the device follows `trainer.accelerator` (auto: CUDA when there is one).
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

import torch

from ragen_lit import __version__
from ragen_lit.agent.chat import ChatFormat
from ragen_lit.agent.rollout import rollout
from ragen_lit.agent.trajectory import Trajectory, rollout_metrics
from ragen_lit.config.typed_fields import check_fields, flag
from ragen_lit.engines import build_engine
from ragen_lit.engines.base import SamplingParams
from ragen_lit.errors import ConfigError
from ragen_lit.models import load_policy
from ragen_lit.models.folders import empty_target, write_model_folder
from ragen_lit.presets import load_chat, resolve_model_path
from ragen_lit.presets.expert_episodes import SFT_SEED, EnvSetup, expert_episodes
from ragen_lit.presets.sft import supervised_finetune
from ragen_lit.presets.tiny.expert import ExpertEngine
from ragen_lit.run.provenance import run_tags
from ragen_lit.training.sections import WarmStartSections
from ragen_lit.training.warm_start_options import WarmStartOptions

RECORD = "warm_start.json"


@dataclass(frozen=True)
class Validation:
    """What `val_envs` validation episodes of a model did: episode success and the share of turns whose reply
    had the format (`format_ok_rate`) and at least one valid action (`valid_turn_rate`), as `fit` logs them."""

    success: float
    format_ok_rate: float
    valid_turn_rate: float

    @classmethod
    def of(cls, trajectories: Sequence[Trajectory]) -> Validation:
        m = rollout_metrics(trajectories, prefix="val")
        return cls(m["val/success"], m["val/format_ok_rate"], m["val/valid_turn_rate"])

    def describe(self) -> str:
        return (
            f"success {self.success:.1%}, format ok in {self.format_ok_rate:.1%} of turns, "
            f"a valid action in {self.valid_turn_rate:.1%}"
        )


def continue_command(config: str | None, overrides: list[str], folder: str) -> str:
    """The `fit` command that trains the warm-started model in `folder` on the same config and overrides: the model
    overrides (`model=...`, `model.name`, `model.path`) are replaced by `model.name=hf model.path=<folder>`."""
    replaced = ("model=", "model.name=", "model.path=")
    kept = [o for o in overrides if not o.startswith(replaced)]
    words = ["python", "-m", "ragen_lit", "fit", *(["--config", config] if config else []), *kept]
    return shlex.join([*words, "model.name=hf", f"model.path={folder}"])


def training_device(accelerator: str) -> torch.device:
    """`trainer.accelerator` as one device: cpu, or CUDA for gpu/cuda and for auto where there is one."""
    if accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(
            f"trainer.accelerator={accelerator} but this machine has no usable CUDA GPU; "
            "use trainer.accelerator=cpu or auto"
        )
    return torch.device("cuda")


def warm_start(cfg: WarmStartSections, options: WarmStartOptions, log: Callable[[str], None] = print) -> dict:
    """Fine-tune `cfg`'s model on the expert's episodes of `cfg`'s env and write it to `options.out` (see the
    module docstring); returns the record written beside the weights."""
    check_fields(options, flag)
    target = empty_target(options.out)
    device = training_device(cfg.trainer.accelerator)
    started = time.perf_counter()
    if cfg.trainer.threads:
        torch.set_num_threads(cfg.trainer.threads)
    source = resolve_model_path(cfg.model)
    tokenizer, chat = load_chat(cfg.model, source)  # model.chat_template applied
    setup = EnvSetup.of(cfg.env, cfg.rollout)
    # the fit's and this command's validation tasks stay out of the imitated episodes (else validation measures recall)
    v = cfg.validation
    held_out = range(v.seed, v.seed + max(v.num_envs, options.val_envs))
    episodes = _expert_episodes(tokenizer, chat, setup, options, held_out)
    expert_success = sum(t.success for t in episodes) / len(episodes)
    log(
        f"expert: {len(episodes)} episodes of {setup.name}, success {expert_success:.1%}, "
        f"{sum(sum(t.loss_mask) for t in episodes) / len(episodes):.0f} reply tokens each"
    )
    model = load_policy(source, "float32", cfg.model.attention).to(device)
    before = _validate(model, chat, setup, cfg, options)
    if before is not None:
        log(f"before: {before.describe()}")
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    report_every = max(1, options.steps // 10)

    def on_step(step: int, loss: float) -> None:
        if step % report_every == 0 or step == options.steps:
            log(f"step {step}/{options.steps}: loss {loss:.4f}")

    losses = supervised_finetune(
        model,
        episodes,
        steps=options.steps,
        batch_size=options.batch_size,
        learning_rate=options.lr,
        pad_token_id=int(tokenizer.pad_token_id),
        seed=options.seed,
        autocast_dtype=torch.bfloat16 if device.type == "cuda" else None,
        on_step=on_step,
    )
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_disable()
    after = _validate(model, chat, setup, cfg, options)
    if after is not None:
        log(f"after: {after.describe()}")
    tail = losses[-10:]
    record = {
        "source_model": source,
        "env": {"name": setup.name, "options": setup.options, "limits": asdict(setup.limits)},
        "options": asdict(options),
        "expert_success": expert_success,
        "first_loss": losses[0],
        "final_loss": sum(tail) / len(tail),  # mean of the last 10 steps
        "validation": {
            "episodes": options.val_envs,
            "seed": cfg.validation.seed,
            "temperature": cfg.validation.temperature,
            "before": None if before is None else asdict(before),
            "after": None if after is None else asdict(after),
        },
        "device": str(device),
        "seconds": round(time.perf_counter() - started, 1),
        "ragen_lit": {"version": __version__, **code_and_weights(source)},
    }
    write_model_folder(target, model, tokenizer, RECORD, record)
    return record


def _expert_episodes(
    tokenizer, chat: ChatFormat, setup: EnvSetup, options: WarmStartOptions, held_out: Sequence[int]
) -> list[Trajectory]:
    """The expert's episodes of `setup`; an env (or env data) the expert cannot play, or none of whose episodes it
    solves, is a ConfigError: imitating it would teach nothing RL could build on."""
    expert = ExpertEngine(tokenizer, epsilon=options.epsilon, seed=options.seed)
    try:
        episodes = expert_episodes(expert, chat, setup, SFT_SEED, options.episodes, held_out=held_out)
    except (ValueError, KeyError) as err:
        raise ConfigError(
            f"env.name={setup.name}: the scripted expert cannot play this env with env.options={setup.options} "
            f"({err}); warm-start needs an env the expert plays"
        ) from None
    if not any(t.success for t in episodes):
        raise ConfigError(
            f"env.name={setup.name}: the scripted expert solved none of its {len(episodes)} episodes with "
            f"env.options={setup.options} (data it has no answers for, or limits too tight); warm-start needs an env "
            "the expert plays"
        )
    return episodes


def _validate(
    model: torch.nn.Module, chat: ChatFormat, setup: EnvSetup, cfg: WarmStartSections, options: WarmStartOptions
) -> Validation | None:
    """`options.val_envs` episodes on the config's validation seeds at its temperature (None when 0)."""
    if options.val_envs == 0:
        return None
    seeds = list(range(cfg.validation.seed, cfg.validation.seed + options.val_envs))
    # the transformers engine with the config's rollout settings (`rollout.dtype` included), as `fit` samples with it;
    # it samples from `model` itself, so no weights path
    hf_rollout = replace(cfg.rollout, engine="hf")
    engine = build_engine(
        hf_rollout, cfg.model, policy=model, model_path="", pad_token_id=int(chat.tokenizer.pad_token_id), seed=0
    )
    sampling = SamplingParams(temperature=cfg.validation.temperature, seed=options.seed)
    model.eval()
    with torch.no_grad():
        trajectories = rollout(engine, setup.make_env, seeds, seeds, chat, setup.limits, sampling)
    engine.release()
    return Validation.of(trajectories)


def code_and_weights(source: str) -> dict:
    """The record's code and weights: the commit (None outside a git checkout), whether it had uncommitted changes,
    and the sha256 of the weights the warm start began from (`run.provenance.run_tags`)."""
    tags = run_tags(source)
    return {
        "commit": tags.get("ragen_lit.commit"),
        "commit_dirty": tags.get("ragen_lit.commit_dirty") == "true",
        "source_weights_sha256": tags.get("ragen_lit.weights_sha256"),
    }
