"""`python -m ragen_lit <command>`: fit, warm-start, sweep, compare, evaluate, diagnose, export, config.

User mistakes end with one clear line."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

# nothing heavier at module level: `--help` and a config that fails to load answer before torch, transformers or
# Lightning would have loaded (each command imports what it uses; scripts/bench_cli.py measures it)
from ragen_lit.config import Config, ConfigError, TrainerConfig, load_config, render_yaml
from ragen_lit.config.typed_fields import add_option_flags
from ragen_lit.errors import RunError

if TYPE_CHECKING:  # the run's modules load with `fit`, after its checks
    from ragen_lit.run.folder import Run


def fit(cfg: Config, verbose: bool = False) -> dict[str, float]:
    """Train; returns the end-of-run summary. `verbose` keeps third-party INFO lines, tips and warnings."""
    from ragen_lit.run.preflight import preflight

    started = time.perf_counter()
    preflight(cfg)  # first: a mistake is refused before torch, Lightning or transformers are imported
    import torch

    from ragen_lit.config import to_dict
    from ragen_lit.run.console import quiet_third_party
    from ragen_lit.run.folder import default_run_name, finished_message
    from ragen_lit.run.opening import open_run

    quiet_third_party(verbose)
    # the run opens once, here: its folder (held by this process until the block ends), its record, its store
    with open_run(cfg.logging, cfg.trainer, default_run_name(cfg), to_dict(cfg)) as run:
        if run.finished:
            print(finished_message(run.folder, run.finished))
            return run.finished["summary"]
        if cfg.trainer.threads:
            torch.set_num_threads(cfg.trainer.threads)
        torch.set_float32_matmul_precision(cfg.trainer.matmul_precision)
        return _fit(cfg, run, started, verbose)


def _fit(cfg: Config, run: Run, started: float, verbose: bool) -> dict[str, float]:
    """`fit`'s training of the opened `run`: the module and the data from their sections, the loggers and the
    callbacks from `run`, then the Trainer; the summary at the end, or a machine's fault in one line."""
    import lightning as L
    from lightning.pytorch.utilities import rank_zero_only

    from ragen_lit.config import flat_dict
    from ragen_lit.run.checkpoint_writer import IterationCheckpoint
    from ragen_lit.run.console import describe_run, run_device
    from ragen_lit.run.faults import machine_fault, mlflow_status, stopped_message, where_stopped
    from ragen_lit.run.folder import format_summary, record_finished, summarize, write_run_info
    from ragen_lit.run.loggers import (
        close_extra_loggers,
        folders_in,
        log_summary,
        make_extra_loggers,
        make_logger,
        where_logged,
    )
    from ragen_lit.run.provenance import run_tags
    from ragen_lit.training.alarm import CollapseAlarmCallback
    from ragen_lit.training.callbacks import IterationLogger, IterationProgressBar, ValidationRollouts
    from ragen_lit.training.data import RolloutDataModule
    from ragen_lit.training.module import AgentRLModule
    from ragen_lit.training.run_figures import RunFigures
    from ragen_lit.training.sections import DataSections, ModuleSections

    L.seed_everything(cfg.trainer.seed, verbose=False)
    module = AgentRLModule(ModuleSections.of(cfg))
    data = RolloutDataModule(DataSections.of(cfg), run.rollouts)
    logger = make_logger(run)
    extra = make_extra_loggers(run, logger.run_id, verbose)
    config = {**flat_dict(cfg), "model.resolved_path": module.model_path}
    rank_zero = rank_zero_only.rank == 0
    trainer, logged_at = None, []
    try:
        if rank_zero:
            # MLflow's params are written once, by the run's first process (they cannot change); the other loggers
            # take the config each process follows
            for each in extra if run.record.get("mlflow_run_id") else [logger, *extra]:
                each.log_hyperparams(config)
            write_run_info(run, logger)
        iteration_logger = IterationLogger(cfg.filter.empty_stop_steps, started)
        validation = ValidationRollouts(cfg.validation)
        run_figures = RunFigures(iteration_logger, validation, run.name)
        checkpoints = IterationCheckpoint(run.checkpoints, run.checkpoint_every)
        # the alarm reads the iteration logger's entry; RunFigures after ValidationRollouts draws the final validation
        alarm = CollapseAlarmCallback(cfg.diagnostics, run.checkpoint_every)
        callbacks = [iteration_logger, alarm, validation, IterationProgressBar(), checkpoints]
        trainer = _trainer(cfg.trainer, run.folder, [logger, *extra], [*callbacks, run_figures])
        if trainer.is_global_zero:
            print(describe_run(cfg, trainer, run.folder), flush=True)
            logged_at = where_logged(extra)
            # the run's placement on record: a CPU and a GPU run of one config differ in numerics (and `auto` dtype)
            logger.experiment.set_tag(logger.run_id, "ragen_lit.device", run_device(trainer, module.policy))
            if not run.record:  # what a new run is made from: the code's commit and the weights it starts from
                for key, value in run_tags(module.model_path).items():
                    logger.experiment.set_tag(logger.run_id, key, value)
        trainer.fit(module, datamodule=data, ckpt_path=run.resume_from)
        # the callbacks' history and results run from the first iteration (checkpointed), not from this resume
        summary = summarize(iteration_logger.history, validation.results, iteration_logger.wall_s())
        if rank_zero:
            log_summary(trainer.loggers, summary, config, step=trainer.current_epoch)
            logger.experiment.log_dict(logger.run_id, summary, "summary.json")
            close_extra_loggers(extra, succeeded=True)
            record_finished(run, summary)  # run.json's `finished`: the record a resume reads
    except BaseException as err:
        fault = machine_fault(err, logger._tracking_uri, folders_in(run.folder))
        why = f"{fault}; the run stopped {where_stopped(trainer)}" if fault else f"{type(err).__name__}: {err}"
        if rank_zero:
            close_extra_loggers(extra, succeeded=False, stopped_by=err)
        # Lightning marked it FAILED already if it was in training; the reason is added either way
        refused = logger.close("FAILED", why.strip().splitlines()[0]) if rank_zero else None
        if fault is None:
            raise
        status = mlflow_status("FAILED", refused)
        raise RunError(stopped_message(fault, run.folder, where_stopped(trainer), status)) from err
    if rank_zero:
        refused = logger.close("FINISHED")
        if refused is not None:
            raise RunError(f"the run finished and run.json records it, but {mlflow_status('FINISHED', refused)}")
        print("\n" + format_summary(summary, f"ragen_lit run {run.folder.name}"))
        store = run.logging.tracking_uri or logger._tracking_uri  # the store, not a tracking_server in front of it
        print(f"run folder: {run.folder}\nMLflow: {store} (run {logger.run_id})")
        for line in logged_at:
            print(line)
    return summary


def _trainer(t: TrainerConfig, folder: Path, loggers: list, callbacks: list):
    """Lightning's Trainer of a run in `folder`, as the trainer section `t` asks: one epoch per RL iteration."""
    import lightning as L

    from ragen_lit.parallel.strategy import choose_strategy
    from ragen_lit.run.checkpoint_writer import StrictCheckpointIO

    return L.Trainer(
        max_epochs=t.iterations,
        accelerator=t.accelerator,
        devices=t.devices,
        num_nodes=t.num_nodes,
        strategy=choose_strategy(t),
        precision=t.precision,
        plugins=[StrictCheckpointIO()],  # a checkpoint that cannot be written stops the run (see its module)
        logger=loggers,
        callbacks=callbacks,
        reload_dataloaders_every_n_epochs=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        log_every_n_steps=1,
        use_distributed_sampler=False,
        default_root_dir=str(folder),
    )


def _fit_command(args) -> int:
    overrides = list(args.overrides)
    if args.tracking_uri:
        overrides.append(f"logging.tracking_uri={args.tracking_uri}")
    fit(load_config(args.config, overrides), verbose=args.verbose)
    return 0


def _config_command(args) -> int:
    cfg = load_config(args.config, list(args.overrides))
    from ragen_lit.run.preflight import check_env, check_logger_packages

    # the same checks as `fit`: a printed config is one that `fit` accepts
    check_logger_packages(cfg.logging)
    check_env(cfg.env, cfg.rollout)
    header = args.header or f"# python -m ragen_lit fit --config {args.config or 'conf/<name>.yaml'}"
    sys.stdout.write(render_yaml(cfg, header))
    return 0


def _sweep_command(args) -> int:
    from ragen_lit.analysis.sweep import run_sweep

    devices = [d.strip() for d in args.devices.split(",") if d.strip()] if args.devices else None
    return run_sweep(
        args.config,
        list(args.overrides),
        seeds=args.seeds,
        parallel=args.parallel,
        threads=args.threads_per_run,
        devices=devices,
        out=args.out,
        name=args.name,
        print_commands=args.print_commands,
        launcher=args.launcher,
    )


def _diagnose_command(args) -> int:
    from ragen_lit.diagnose import DiagnoseOptions, run_diagnose

    return run_diagnose(DiagnoseOptions(**{f.name: getattr(args, f.name) for f in dataclasses.fields(DiagnoseOptions)}))


def _evaluate_command(args) -> int:
    from ragen_lit.evaluation.run import EvaluateOptions, run_evaluate

    options = EvaluateOptions(**{f.name: getattr(args, f.name) for f in dataclasses.fields(EvaluateOptions)})
    return run_evaluate(args.config or [], list(args.overrides), options)


def _export_command(args) -> int:
    from ragen_lit.run.trained_policy import export_run

    out = export_run(args.run, args.out)
    print(f"exported the trained policy to {out} (load it with model.path={out} or from_pretrained)")
    return 0


def _warm_start_command(args) -> int:
    from ragen_lit.run.preflight import preflight
    from ragen_lit.training.warm_start_options import WarmStartOptions

    cfg = load_config(args.config, list(args.overrides))
    preflight(cfg)  # the checks `fit` makes first (a model path, the env's options, the device), before torch loads
    from ragen_lit.run.console import quiet_third_party
    from ragen_lit.training.sections import WarmStartSections
    from ragen_lit.training.warm_start import RECORD, continue_command, warm_start

    quiet_third_party()
    options = WarmStartOptions(**{f.name: getattr(args, f.name) for f in dataclasses.fields(WarmStartOptions)})
    record = warm_start(WarmStartSections.of(cfg), options)
    out = str(Path(options.out).expanduser().resolve())
    print(f"warm-started {record['source_model']} written to {out} (record: {out}/{RECORD})")
    print("continue with RL:\n  " + continue_command(args.config, args.overrides, out))
    if record["device"].startswith("cuda") and cfg.model.dtype != "float32":
        print(
            "  on a GPU, add model.dtype=float32 trainer.precision=bf16-mixed: a real LM's RL step rounds away in "
            "bfloat16 weights (README, Precision)"
        )
    return 0


def _compare_command(args) -> int:
    from ragen_lit.analysis.compare import run_compare

    positional = ("targets", "tracking_uri", "baseline", "format", "out", "metrics", "predictors_at", "finished_only")
    return run_compare(
        *(getattr(args, name) for name in positional),
        args.differences,
        args.collapse,
        predictors_target=args.predictors_target,
        predictors_window=args.predictors_window,
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # the command's word: the top level takes no option with a value. The flags of warm-start, diagnose and evaluate
    # come from their option classes, loaded only for that command (diagnose's module imports torch)
    command = next((word for word in argv if not word.startswith("-")), None)
    parser = argparse.ArgumentParser(prog="python -m ragen_lit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_fit = sub.add_parser("fit", help="train an agent (one Lightning epoch per RL iteration)")
    p_fit.add_argument("--config", help="YAML config (see conf/)")
    p_fit.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite store in logging.output_dir)")
    p_fit.add_argument(
        "--verbose", action="store_true", help="also show third-party INFO lines, tips and warnings (hidden by default)"
    )
    p_fit.add_argument("overrides", nargs="*", help="key.sub=value overrides, section=preset for algo/model")
    p_fit.set_defaults(func=_fit_command)
    p_warm = sub.add_parser(
        "warm-start",
        help="fine-tune the config's model on the scripted expert's episodes of its env, as a start for fit",
    )
    p_warm.add_argument("--config", help="YAML config (see conf/): its model, env options and rollout limits")
    if command == "warm-start":
        from ragen_lit.training.warm_start_options import WarmStartOptions

        add_option_flags(p_warm, WarmStartOptions)
    p_warm.add_argument("overrides", nargs="*", help="key.sub=value overrides, section=preset, as for fit")
    p_warm.set_defaults(func=_warm_start_command)
    p_cfg = sub.add_parser("config", help="print the resolved config as commented YAML")
    p_cfg.add_argument("--config")
    p_cfg.add_argument("--header", help="first line of the YAML (the command that runs it)")
    p_cfg.add_argument("overrides", nargs="*")
    p_cfg.set_defaults(func=_config_command)
    p_sweep = sub.add_parser("sweep", help="a grid of fits (Hydra's sweep grammar) x seeds, one process each")
    p_sweep.add_argument("--config", help="YAML config every run starts from (see conf/)")
    seeds_help = "runs per grid point, trainer.seed = 0..N-1 (a sweep makes at most 10,000 runs: grid points x seeds)"
    p_sweep.add_argument("--seeds", type=int, default=1, help=seeds_help)
    p_sweep.add_argument(
        "--parallel",
        type=int,
        help="runs at a time (default: CPU cores / --threads-per-run); joblib's n_jobs, submitit_slurm's "
        "array_parallelism",
    )
    p_sweep.add_argument(
        "--threads-per-run", type=int, default=1, help="CPU cores (torch threads) of each run; submitit's cpus_per_task"
    )
    p_sweep.add_argument("--devices", help="GPU ids, one run per GPU at a time, e.g. 0,1,2,3 (--launcher local)")
    p_sweep.add_argument(
        "--launcher",
        default="local",
        help="local (default: a process pool here) | joblib | submitit_local | submitit_slurm: Hydra's launcher "
        "plugins (pip install 'ragen_lit[launchers]'), set with hydra.launcher.<key>=<value> words",
    )
    p_sweep.add_argument("--out", help="parent folder of the sweep (default: <logging.output_dir>/sweeps)")
    p_sweep.add_argument("--name", help="sweep name (default: the config's name and a hash of the grid)")
    p_sweep.add_argument(
        "--print-commands",
        action="store_true",
        help="write every run's config and print one fit command per run (for a cluster launcher)",
    )
    p_sweep.add_argument(
        "overrides",
        nargs="*",
        help="key=value, key=a,b,c, key=range(start,stop,step), key=choice(..); hydra.launcher.<key>=<value>",
    )
    p_sweep.set_defaults(func=_sweep_command)
    p_diag = sub.add_parser("diagnose", help="MI collapse diagnostics of a model on a rollouts JSONL file")
    if command == "diagnose":
        from ragen_lit.diagnose import DiagnoseOptions

        add_option_flags(p_diag, DiagnoseOptions)
    p_diag.set_defaults(func=_diagnose_command)
    p_eval = sub.add_parser(
        "evaluate", help="play a model (a run, checkpoint, model folder or preset) on fixed episodes: success, pass@k"
    )
    p_eval.add_argument(
        "--config",
        action="append",
        help="YAML config of the environment, engine and episodes (repeat for several environments; default: the "
        "run's own config, or the defaults)",
    )
    if command == "evaluate":
        from ragen_lit.evaluation.run import EvaluateOptions

        add_option_flags(p_eval, EvaluateOptions)
    p_eval.add_argument("overrides", nargs="*", help="key.sub=value overrides applied to every config, as for fit")
    p_eval.set_defaults(func=_evaluate_command)
    p_exp = sub.add_parser("export", help="write a run's trained policy as a transformers model folder")
    p_exp.add_argument("run", help="a run folder (its newest checkpoint) or a checkpoint")
    p_exp.add_argument("--out", required=True, help="the folder to write (new or empty)")
    p_exp.set_defaults(func=_export_command)
    p_cmp = sub.add_parser("compare", help="table and figures comparing runs (grouped by grid point) from MLflow")
    p_cmp.add_argument("targets", nargs="*", help="folders to search for **/mlruns.db, or run ids/names/points")
    p_cmp.add_argument("--tracking-uri", help="one more MLflow store or server")
    p_cmp.add_argument("--baseline", help="a point, or KEY=VALUE: per block of other factors (default: strategy=none)")
    p_cmp.add_argument("--format", default="markdown", help="markdown (default) | csv | json")
    p_cmp.add_argument("--out", help="folder for the figures and table (default: <first PATH>/compare)")
    p_cmp.add_argument(
        "--metrics",
        nargs="+",
        help="columns to show: column names (val_success_mean too) or logged keys"
        "[:last|first|max|mean|mean_last3|mean_after_first|at<step>]",
    )
    p_cmp.add_argument(
        "--differences",
        nargs="+",
        help="columns whose difference to the baseline is shown, as --metrics names them (default: "
        "val_success_final), e.g. val_success_final val_success_best val_success_mean train_success",
    )
    p_cmp.add_argument(
        "--finished-only",
        action="store_true",
        help="leave out runs that did not finish (killed, failed, still running); they are always named on stderr",
    )
    p_cmp.add_argument(
        "--predictors-at",
        metavar="STEP|all",
        help="also tabulate Spearman's rho of the MI and entropy metrics at this iteration (or at every iteration "
        "they were logged at: all) with final success (Fig. 8), with a bootstrap interval of |rho| of the trajectory "
        "MI z-score minus |rho| of token entropy",
    )
    p_cmp.add_argument(
        "--predictors-target",
        type=int,
        metavar="STEP",
        help="with --predictors-at: correlate with each run's mean val/success at steps >= STEP (default: the last)",
    )
    p_cmp.add_argument(
        "--predictors-window",
        type=int,
        default=1,
        metavar="N",
        help="with --predictors-at: a predictor's value is the mean of its last N points up to the iteration",
    )
    p_cmp.add_argument(
        "--collapse",
        action="store_true",
        help="also read MI loss run by run: its regime (template collapse, entropy blow-up, low-entropy collapse), "
        "when the alarm and a one- and a two-sided entropy monitor fired; per point their hits and false alarms",
    )
    p_cmp.set_defaults(func=_compare_command)
    # argparse takes one run of positionals: `key=value` words after a flag (`... --out DIR env.options.size=5`)
    # come back unknown, and are overrides like the ones before it
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        if hasattr(args, "overrides") and all("=" in word and not word.startswith("-") for word in unknown):
            args.overrides = [*args.overrides, *unknown]
        else:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        return args.func(args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except RunError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: checkpoints and logged metrics written so far are kept", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
