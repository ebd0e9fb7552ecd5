"""`python -m ragen_lit.analysis.sweep_app`: the Hydra app whose task runs one run of a planned sweep, for Hydra's
launchers.

`python -m ragen_lit sweep --launcher joblib|submitit_local|submitit_slurm` plans the grid, writes every run's
`config.yaml` and starts this app as a multirun over the runs not yet done, one job per run
(`analysis.sweep_launchers`). A job's task (`analysis.sweep_run.run_attempt`) resumes the run from its checkpoint or
starts it afresh, runs its `fit` as a child process whose output goes to the run's `sweep.log` (writing the sweep's
store through the MLflow server `sweep` runs meanwhile, `tracking_server`), and leaves the run's
`sweep_done` or `sweep_failed` marker; a failed run does not fail its job, so that the launcher returns every job
and `sweep` reports each run from its markers. A job that a launcher starts again (submitit's requeue after a time
limit, `hydra.launcher.max_num_timeout`) resumes its run.

On a sweep folder that `sweep` (or `sweep --print-commands`) wrote, it also runs by hand, e.g.

    python -m ragen_lit.analysis.sweep_app --multirun hydra/launcher=submitit_slurm hydra.launcher.partition=gpu \\
        sweep=runs/sweeps/frozenlake-1a2b3c4d run=filter.strategy-none-seed0,filter.strategy-top_p-seed0

Run by hand it does not take the sweep folder's lock (`sweep` holds it while its runs go): start one multirun at a
time on a folder. Nor does it start the sweep's MLflow server: runs whose config names the sweep's store write that
sqlite file directly, which is safe one at a time; for several at once, give `tracking_server=` a server of your own
on that store (`mlflow server --backend-store-uri sqlite:///<sweep>/mlruns.db`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from ragen_lit.analysis.sweep_run import run_attempt


@dataclass
class SweepRunConfig:
    """The app's config: which run of which sweep a job runs."""

    sweep: str = MISSING
    """the sweep folder (`<out>/<name>`, holding one folder per run)"""
    run: str = MISSING
    """the run's folder name in it (`<point>-seed<k>`); a comma-separated list makes a multirun of them"""
    tracking_server: str | None = None
    """the MLflow server `sweep` runs on the sweep's store while its jobs run (`sweep_server`); a run that writes
    that store writes through it. None: every run writes its store directly"""


ConfigStore.instance().store(name="sweep_run", node=SweepRunConfig)


@hydra.main(version_base=None, config_name="sweep_run")
def main(config: SweepRunConfig) -> bool:
    """One job: the run `config.run` of the sweep `config.sweep` to its end; whether it finished."""
    return run_attempt(Path(config.sweep).expanduser().resolve() / config.run, config.tracking_server)


if __name__ == "__main__":
    main()
