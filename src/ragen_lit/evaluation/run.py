"""`python -m ragen_lit evaluate`: play a model on fixed episodes K times each, report and record the result.

The episodes are a config's validation seeds (`validation.seed`, `validation.seed + 1`, ..., `--episodes` of them,
default `validation.num_envs`) or the seeds of `--episodes-file`; each is played `--samples` times at
`--temperature` (default `validation.temperature`) with sampling seed `--seed` (default `validation.seed`), through
the config's engine and episode limits (`rollout.*`, the vLLM engine included), in one `run_rollouts` call as `fit`
validates. With one sample and the defaults an evaluation of a run's final checkpoint plays exactly the episodes of
its final validation and returns the same success rate.

Without `--config` a run's own config (its run.json) is used, and the defaults for any other model. Several
`--config`s evaluate the model on each environment in turn; `key=value` overrides apply to every one. Each
evaluation is logged as an MLflow run tagged `ragen_lit.role=evaluation` in the evaluated run's store (else the
config's), labelled `<the run's point or name> (evaluation)`, so `compare` shows it beside the training runs; the JSON
report holds every number and each seed's successes.

A mistake ends in one line before any model loads or anything is written: the options, a `--model` file that is no
checkpoint or `model` overrides of a run's own model, the report's path and the MLflow stores, the episodes x
samples this machine's memory holds (`run.bounds`' bound of `fit`'s episodes), then `fit`'s preflight.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ragen_lit.config import Config, RolloutConfig, ValidationConfig, load_config
from ragen_lit.config.loading import load_saved_config
from ragen_lit.config.sections import MAX_SEED
from ragen_lit.config.typed_fields import check_fields, checked, flag
from ragen_lit.errors import ConfigError

if TYPE_CHECKING:  # the checks before any work import no torch
    from ragen_lit.training.sections import DataSections

ONE_PROCESS = {"devices": 1, "num_nodes": 1, "strategy": "auto"}


@dataclass
class EvaluateOptions:
    """The options of `python -m ragen_lit evaluate` besides `--config`; each field is the flag `--<name>`."""

    model: str
    """a run folder (its newest checkpoint) or checkpoint, a model folder, an HF id or a preset (tiny, smollm2-135m)"""
    episodes: int | None = checked(None, ge=1)
    """episodes (seeds validation.seed, validation.seed + 1, ...); default validation.num_envs. Episodes x samples are
    bounded by this machine's memory as fit bounds its episodes (the error names the largest allowed)"""
    episodes_file: str | None = None
    """a file of episode seeds, one integer per line (# comments and blank lines skipped), instead of the validation
    seeds"""
    samples: int = checked(1, ge=1)
    """K: times each episode is played (pass@k for k <= K)"""
    temperature: float | None = checked(None, ge=0.0)
    """sampling temperature; default validation.temperature (0: greedy)"""
    seed: int | None = checked(None, ge=0, le=MAX_SEED)
    """sampling seed; default validation.seed (as fit's validation samples)"""
    out: str | None = None
    """the JSON report to write (checked before any work; written before the MLflow runs are logged); default <run
    folder>/evaluations/eval-<time>.json for a run, else under <logging.output_dir>/evaluations/"""


def read_seed_file(path: str, most: int | None = None) -> list[int]:
    """The seeds of `--episodes-file`: one integer in [0, 2^32 - 1] per line; blank lines and `#` comments skipped.
    Read no further than `most` + 1 seeds (one past: a file holding more is refused without reading all of it).
    Raises ConfigError naming the file and line."""
    seeds: list[int] = []
    try:
        with open(Path(path).expanduser()) as lines:
            for number, line in enumerate(lines, 1):
                text = line.split("#", 1)[0].strip()
                if not text:
                    continue
                if not text.isdigit() or int(text) > MAX_SEED:
                    raise ConfigError(
                        f"--episodes-file {path}, line {number}: {text!r} is not a seed (an integer in 0..{MAX_SEED})"
                    )
                seeds.append(int(text))
                if most is not None and len(seeds) > most:
                    break
    except FileNotFoundError:
        raise ConfigError(f"--episodes-file {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"--episodes-file {path}: cannot be read ({err})") from None
    if not seeds:
        raise ConfigError(f"--episodes-file {path}: holds no seed (one integer per line)")
    return seeds


def episode_seeds(
    validation: ValidationConfig, rollout: RolloutConfig, options: EvaluateOptions, where: str
) -> list[int]:
    """The seeds a config's episodes are played on (module docstring: `validation`'s seeds or the file's), no more
    than this machine holds at `--samples` each with `rollout`'s context (`check_played`)."""
    from ragen_lit.run.bounds import available_memory, host_episodes

    memory = available_memory()
    if options.episodes_file is not None:
        most = host_episodes(rollout, memory) // options.samples
        seeds = read_seed_file(options.episodes_file, most)
        cut = len(seeds) > most  # the file holds more: it was not read to its end
        held = f"more than {most} seeds; its first {len(seeds)}" if cut else f"{len(seeds)} seeds"
        check_played(
            rollout, len(seeds), options.samples, memory, f"--episodes-file {options.episodes_file} ({held})", cut
        )
        return seeds
    count = options.episodes or validation.num_envs
    if count == 0:
        raise ConfigError(f"{where}: validation.num_envs=0, so there are no validation episodes; give --episodes N")
    named = f"--episodes {count}" if options.episodes else f"validation.num_envs={count} (the default --episodes)"
    check_played(rollout, count, options.samples, memory, named)
    return list(range(validation.seed, validation.seed + count))


def check_played(rollout: RolloutConfig, count: int, samples: int, memory: int, named: str, cut: bool = False) -> None:
    """`count` episodes x `samples` are played in one rollout call, held on the host as an iteration of `fit` is:
    refused past the bound `fit` keeps (`run.bounds.host_episodes`, with `memory` bytes available) in one line
    naming the option and its largest value. `named`: the option that gave the episodes, with its value; `cut`: a
    seed file read only in part (it holds more than `count`)."""
    from ragen_lit.run.bounds import HOST_BYTES_PER_TOKEN, host_episodes, host_need

    fit = host_episodes(rollout, memory)
    if count * samples <= fit:
        return
    need = host_need(rollout, count * samples, memory)
    if count <= fit and not cut:  # each episode once fits: the samples are too many
        raise ConfigError(f"--samples {samples} x {named} = {need}; use at most --samples {fit // count}")
    if fit == 0:
        allowed = f"not one episode fits: use at most rollout.max_context_tokens={memory // HOST_BYTES_PER_TOKEN}"
    elif fit < samples:
        allowed = f"not one episode at --samples {samples} fits: use at most --samples {fit}"
    elif named.startswith("--episodes-file"):
        allowed = f"give at most {fit // samples} seed{'s' if fit // samples > 1 else ''} in the file"
    else:
        allowed = f"use at most --episodes {fit // samples}"
    raise ConfigError(f"{named} x --samples {samples} = {need}; {allowed}")


def check_options(options: EvaluateOptions) -> None:
    check_fields(options, flag)
    if options.episodes is not None and options.episodes_file is not None:
        raise ConfigError("--episodes and --episodes-file: give one (the file's seeds are the episodes)")
    if options.samples > 1 and options.temperature == 0:
        raise ConfigError(
            f"--samples {options.samples} with --temperature 0: greedy decoding plays each episode the same way "
            "every time; sample at a temperature > 0 or use --samples 1"
        )


def evaluation_configs(
    configs: list[str], overrides: list[str], model: str, run_json: Path | None
) -> list[tuple[Config, str]]:
    """(config, where it came from) per environment, each with the evaluated model in its model section; `run_json`:
    the run.json of the run `model` names (None for a model that is not a run's)."""
    from ragen_lit.evaluation.policy import model_overrides, run_model

    if run_json is None:
        overrides = [*overrides, *model_overrides(model)]
    else:  # the checkpoint's weights fit the run's own model only: an override of it would be dropped unsaid
        for override in overrides:
            if override.split("=", 1)[0].lstrip("+~").split(".")[0] == "model":
                raise ConfigError(
                    f"{override}: --model {model} names a run, and a run is evaluated with its own model (the model "
                    f"section of {run_json}); drop the override, or pass the model to evaluate as --model"
                )
    if configs:
        loaded = [(load_config(path, overrides), path) for path in configs]
    elif run_json is not None:
        loaded = [(load_saved_config(run_json, overrides), str(run_json))]
    else:
        loaded = [(load_config(None, overrides), "defaults")]
    if run_json is not None:
        base = run_model(model)
        loaded = [(replace(cfg, model=base), where) for cfg, where in loaded]
    # one process on one device, whatever the run was trained on (the machine check then asks for one device only)
    loaded = [(replace(cfg, trainer=replace(cfg.trainer, **ONE_PROCESS)), where) for cfg, where in loaded]
    first, first_where = loaded[0]
    for cfg, where in loaded[1:]:
        agree = {
            "model": cfg.model == first.model,
            "trainer.accelerator": cfg.trainer.accelerator == first.trainer.accelerator,
        }
        for key, same in agree.items():
            if not same:
                raise ConfigError(
                    f"--config {where}: {key} differs from {first_where}'s; the model is loaded once, so the configs "
                    f"must agree on {key} (override it on the command line)"
                )
    return loaded


def run_evaluate(configs: list[str], overrides: list[str], options: EvaluateOptions) -> int:
    """Check everything, load the model once, evaluate it on each config's episodes; print, write and log it.
    Returns the exit code (0). Raises ConfigError on a user mistake, before any model is loaded or anything is
    written: the options, the configs, the report's path and the MLflow stores, the episodes this machine holds, then
    `fit`'s preflight."""
    check_options(options)  # first: it needs no config, torch or model
    from ragen_lit.evaluation.policy import run_config_of
    from ragen_lit.evaluation.record import check_report_path, check_store, report_path, store_of

    run_json = run_config_of(options.model)
    loaded = evaluation_configs(configs, overrides, options.model, run_json)
    out, key = report_path(options.out, run_json, loaded[0][0].logging)
    check_report_path(out, key)
    stores = [store_of(cfg.logging, run_json, overrides) for cfg, _ in loaded]
    for store in dict.fromkeys(stores):
        check_store(store)
    plans = [(cfg, where, episode_seeds(cfg.validation, cfg.rollout, options, where)) for cfg, where in loaded]
    from ragen_lit.run.console import quiet_third_party
    from ragen_lit.run.preflight import preflight

    for cfg, _, seeds in plans:
        # fit's checks, with the evaluation's rollout call as its validation (the generation batch's bound)
        played = replace(cfg.validation, num_envs=len(seeds) * options.samples)
        preflight(replace(cfg, validation=played))
    quiet_third_party()  # after the checks: it imports transformers

    import torch

    from ragen_lit.evaluation.policy import load_evaluated_policy
    from ragen_lit.evaluation.record import log_evaluations
    from ragen_lit.evaluation.report import format_evaluation
    from ragen_lit.training.sections import DataSections
    from ragen_lit.training.warm_start import training_device

    first = plans[0][0]
    if first.trainer.threads:
        torch.set_num_threads(first.trainer.threads)
    torch.set_float32_matmul_precision(first.trainer.matmul_precision)
    accelerator = first.trainer.accelerator
    evaluated = load_evaluated_policy(options.model, first.model, accelerator, training_device(accelerator))
    at = f", iteration {evaluated.iteration}" if evaluated.iteration is not None else ""
    print(f"evaluating {evaluated.description}{at} on {evaluated.device}", flush=True)
    results = []
    for cfg, where, seeds in plans:
        result = play(DataSections.of(cfg), cfg.validation, where, seeds, options, evaluated)
        print(format_evaluation(result), flush=True)
        results.append((cfg, result))
    # the report first, then MLflow: no evaluation is logged whose report was not written
    logged = log_evaluations(out, options.model, run_json, evaluated, results, stores)
    print(f"report: {out}")
    for uri, run_id in logged:
        print(f"MLflow: {uri} (run {run_id})")
    return 0


def play(
    sections: DataSections,
    validation: ValidationConfig,
    where: str,
    seeds: list[int],
    options: EvaluateOptions,
    evaluated,
):
    """K samples of every seed in one rollout call through the engine and env of `sections` (`validation`: the
    temperature and sampling seed `options` leave to it); returns its `EnvEvaluation`."""
    from ragen_lit.evaluation.report import evaluate_trajectories
    from ragen_lit.training.data import RolloutDataModule

    temperature = validation.temperature if options.temperature is None else options.temperature
    sampling_seed = validation.seed if options.seed is None else options.seed
    k = options.samples
    played_seeds = [seed for seed in seeds for _ in range(k)]
    positions = [i for i in range(len(seeds)) for _ in range(k)]
    started = time.perf_counter()
    data = RolloutDataModule(sections)
    trajectories = data.run_rollouts(evaluated, played_seeds, positions, temperature, seed=sampling_seed)
    return evaluate_trajectories(
        trajectories,
        seeds,
        k,
        env=sections.env.name,
        config=where,
        temperature=temperature,
        sampling_seed=sampling_seed,
        seconds=time.perf_counter() - started,
    )
