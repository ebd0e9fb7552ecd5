"""`sweep --launcher joblib|submitit_local|submitit_slurm`: refusals in one line before anything is written, the
launcher settings Hydra gets, and sweeps through the real plugins (joblib on runs that fail fast; a 2 x 2 grid of
tiny-model fits through submitit_local, run twice)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import mlflow
import pytest
from tests.training.small_fit import CONFIG, SMALL

from ragen_lit.analysis import sweep_launchers
from ragen_lit.analysis.sweep_launchers import launcher_settings, multirun_command, split_settings
from ragen_lit.analysis.sweep_run import DONE_MARKER, FAILED_MARKER, LOG_NAME
from ragen_lit.cli import main


def test_launcher_settings_are_not_part_of_the_grid():
    grid, settings = split_settings(
        ["filter.strategy=none,top_p", "hydra.launcher.partition=gpu", "+hydra.launcher.x=1", "trainer.iterations=2"]
    )
    assert grid == ["filter.strategy=none,top_p", "trainer.iterations=2"]
    assert settings == ["hydra.launcher.partition=gpu", "+hydra.launcher.x=1"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--launcher", "slurm"], "--launcher slurm: no such launcher; choose one of local, joblib, submitit_local, "),
        (["hydra.launcher.n_jobs=2"], "hydra.launcher.n_jobs=2: launcher settings are for Hydra's launchers; add "),
        (["--launcher", "joblib", "--devices", "0"], "--devices places runs on GPUs with --launcher local only"),
        (["--launcher", "submitit_local", "--parallel", "2"], "--launcher submitit_local starts every run at once"),
        (["--launcher", "joblib", "--print-commands"], "--print-commands prints the runs' commands for a launcher"),
        (["--launcher", "joblib", "hydra.sweep.dir=x"], "hydra.sweep.dir=x: the sweep sets Hydra's own settings"),
        (["--launcher", "joblib", "hydra/launcher=basic"], "hydra/launcher=basic: the sweep sets Hydra's own"),
        (
            ["--launcher", "joblib", "hydra.launcher.n_jobz=2"],
            "hydra.launcher.n_jobz=2: the joblib launcher has no setting 'n_jobz'; its settings: n_jobs, backend,",
        ),
        (
            ["--launcher", "submitit_slurm", "+hydra.launcher.partiton=gpu"],
            "+hydra.launcher.partiton=gpu: the submitit_slurm launcher has no setting 'partiton'",
        ),
        (
            ["--launcher", "joblib", "hydra.launcher.n_jobs=x"],
            "--launcher joblib: Error merging override hydra.launcher.n_jobs=x: Value 'x' of type 'str' could not be "
            "converted to Integer",
        ),
        (["--launcher", "submitit_slurm", "hydra.launcher.partition=a,b"], "a launcher setting takes one value"),
        (
            ["--launcher", "joblib", "--parallel", "2", "hydra.launcher.n_jobs=4"],
            "--parallel 2 and hydra.launcher.n_jobs set the same; give one",
        ),
        (
            ["--launcher", "submitit_slurm", "hydra.launcher.tasks_per_node=4"],
            "hydra.launcher.tasks_per_node=4: a sweep's job is one process running one fit",
        ),
        (
            ["--launcher", "submitit_slurm", "trainer.devices=1,2"],
            "grid point 'trainer.devices=2': trainer.devices=2 trainer.num_nodes=1, but --launcher submitit_slurm "
            "runs each run as one process",
        ),
        (["--launcher", "submitit_local", "filter.strategy=none,nope"], "filter.strategy='nope' is not allowed"),
        # values in the range each setting of the plugin's config means something in
        (
            ["--launcher", "submitit_local", "hydra.launcher.timeout_min=-5"],
            "hydra.launcher.timeout_min=-5: the submitit_local launcher's timeout_min must be >= 1 (the job's time "
            "limit, in minutes)",
        ),
        (
            ["--launcher", "submitit_slurm", "hydra.launcher.array_parallelism=0"],
            "hydra.launcher.array_parallelism=0: the submitit_slurm launcher's array_parallelism must be >= 1",
        ),
        (["--launcher", "submitit_slurm", "+hydra.launcher.mem_gb=-1"], "launcher's mem_gb must be >= 0"),
        (["--launcher", "submitit_slurm", "hydra.launcher.gpus_per_node=-2"], "gpus_per_node must be >= 0"),
        (["--launcher", "submitit_local", "hydra.launcher.cpus_per_task=0"], "cpus_per_task must be >= 1"),
        (["--launcher", "joblib", "hydra.launcher.n_jobs=0"], "joblib launcher's n_jobs must be other than 0"),
        (["--launcher", "joblib", "hydra.launcher.timeout=0"], "joblib launcher's timeout must be > 0"),
        (["--launcher", "joblib", "hydra.launcher.verbose=-1"], "joblib launcher's verbose must be >= 0"),
        # the sweep's checks of its runs, on this machine's launchers
        (
            ["--launcher", "joblib", "rollout.groups=2,1000000000"],
            "grid point 'rollout.groups=1000000000': rollout.groups=1000000000 x rollout.group_size=8",
        ),
        (["--launcher", "submitit_local", "--threads-per-run", "100000"], "--threads-per-run 100000: this machine"),
    ],
)
def test_a_launcher_that_does_not_apply_is_refused_in_one_line_before_anything_is_written(
    tmp_path, capsys, args, message
):
    assert main(["sweep", "--config", CONFIG, "--out", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["-1", "2", "8"])
def test_joblib_takes_any_n_jobs_but_0(value):
    assert launcher_settings("joblib", [f"hydra.launcher.n_jobs={value}"], None, threads=1, cores=2) == [
        f"hydra.launcher.n_jobs={value}"
    ]


@pytest.mark.parametrize("launcher", ["joblib", "submitit_local", "submitit_slurm"])
def test_a_launcher_whose_plugin_is_not_installed_names_the_extra(tmp_path, capsys, monkeypatch, launcher):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        sweep_launchers.importlib.util,
        "find_spec",
        lambda name, *args: None if name.startswith("hydra_plugins.") else real(name, *args),
    )
    assert main(["sweep", "--config", CONFIG, "--out", str(tmp_path), "--launcher", launcher]) == 2
    assert capsys.readouterr().err == (
        f"error: --launcher {launcher} needs Hydra's {launcher} launcher plugin: pip install 'ragen_lit[launchers]'\n"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("launcher", "settings", "parallel", "expected"),
    [
        ("joblib", [], None, ["hydra.launcher.n_jobs=6"]),  # as many at a time as the pool would run
        ("joblib", [], 2, ["hydra.launcher.n_jobs=2"]),
        ("joblib", ["hydra.launcher.n_jobs=3"], None, ["hydra.launcher.n_jobs=3"]),
        ("submitit_local", [], None, ["hydra.launcher.cpus_per_task=4"]),
        (
            "submitit_slurm",
            ["hydra.launcher.partition=gpu"],
            8,
            ["hydra.launcher.array_parallelism=8", "hydra.launcher.cpus_per_task=4", "hydra.launcher.partition=gpu"],
        ),
        ("submitit_slurm", ["hydra.launcher.cpus_per_task=16"], None, ["hydra.launcher.cpus_per_task=16"]),
    ],
)
def test_parallel_and_threads_map_onto_the_plugins_settings(launcher, settings, parallel, expected):
    assert launcher_settings(launcher, settings, parallel, threads=4, cores=6) == expected


def test_the_multirun_reads_back_paths_and_names_of_any_characters(tmp_path):
    """The sweep folder, the run names and the sweep's MLflow server reach the app as the strings they are (Hydra's
    grammar, quoted)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    sweep = tmp_path / "a b, c='d'" / "s"
    runs, settings, server = ["x-seed0", "y.z-seed1"], ["hydra.launcher.n_jobs=2"], "http://127.0.0.1:5000"
    command = multirun_command(sweep, runs, "joblib", settings, tmp_path / "r", server)
    assert command[1:4] == ["-m", "ragen_lit.analysis.sweep_app", "--multirun"]
    parsed = {o.key_or_group: o for o in OverridesParser.create().parse_overrides(command[4:])}
    assert parsed["sweep"].value() == str(sweep) and parsed["hydra.sweep.dir"].value() == str(tmp_path / "r")
    assert parsed["tracking_server"].value() == server
    assert "tracking_server" not in " ".join(multirun_command(sweep, runs, "joblib", settings, tmp_path / "r"))
    jobs = OverridesParser.create().parse_overrides([f"run={v}" for v in parsed["run"].sweep_string_iterator()])
    assert [job.value() for job in jobs] == ["x-seed0", "y.z-seed1"]  # each job's override, as Hydra's sweeper makes it
    assert parsed["hydra/launcher"].value() == "joblib" and parsed["hydra.launcher.n_jobs"].value() == 2
    # Hydra's own lines off the console, a job's log kept in its file (options and keys of the installed hydra-core)
    assert parsed["hydra/hydra_logging"].value() == "none"
    assert parsed["hydra.job_logging.root.handlers"].value() == ["file"]


def test_joblib_runs_each_run_as_a_job_and_reports_the_ones_that_failed(tmp_path, capfd):
    """Two runs whose fit refuses the checkpoint to resume from (exit 2, before any training; the sweep's own checks
    do not read it): each job records its run's end, the sweep reports both from their markers and fails; the runs'
    logs hold the fit's error. The console (the multirun's output included: `capfd`) names each run once, in the
    sweep's own line, without Hydra's log lines; each job's log is in its folder of Hydra's records."""
    args = ["sweep", "--config", CONFIG, "--out", str(tmp_path), "--name", "s", "--launcher", "joblib"]
    assert main([*args, "trainer.resume=/no/a.ckpt,/no/b.ckpt", "hydra.launcher.verbose=0"]) == 1
    out, err = capfd.readouterr()
    assert "2 runs, through Hydra's joblib launcher" in out
    sweep = tmp_path / "s"
    (records,) = (sweep / "hydra").iterdir()  # Hydra's records of the launch, one folder per job
    runs = [(f"trainer.resume=/no/{x}.ckpt", f"trainer.resume-no{x}.ckpt-seed0") for x in "ab"]
    for point, folder in runs:
        assert f"FAILED  {point} seed 0 (exit 2; see {sweep / folder / LOG_NAME})" in out
        assert out.count(folder) == 1 and out.count(point) == 1, out
        assert (sweep / folder / FAILED_MARKER).read_text() == "exit 2\n"
        assert "no such checkpoint file or folder" in (sweep / folder / LOG_NAME).read_text()
        assert f"[INFO] - FAILED: {sweep / folder} (exit 2" in (records / folder / "s.log").read_text()
    assert "0 finished, 0 already done, 2 failed" in out
    assert "[HYDRA]" not in out + err and "[INFO]" not in out + err, (out, err)
    assert sorted(p.name for p in records.iterdir() if p.is_dir()) == [folder for _, folder in runs]


def _tags(sweep: Path) -> list[dict[str, str]]:
    """The tags `sweep`, `point` and `seed` of every run in the sweep's one store, each run finished."""
    mlflow.set_tracking_uri(f"sqlite:///{sweep / 'mlruns.db'}")
    rows = mlflow.search_runs(experiment_names=["ragen_lit"]).to_dict("records")
    mlflow.set_tracking_uri(None)
    assert all(row["status"] == "FINISHED" and row["metrics.summary/iterations"] == 1 for row in rows)
    return sorted(({key: row[f"tags.{key}"] for key in ("sweep", "point", "seed")} for row in rows), key=str)


@pytest.mark.slow
def test_a_two_by_two_grid_runs_through_submitit_local_and_a_second_sweep_skips_it(tmp_path, capsys):
    """2 grid points x 2 seeds of the tiny model, one iteration each, as four submitit jobs: every run finishes with
    its done marker and its MLflow tags in the sweep's one store, written through the sweep's server; the same sweep
    again (with another launcher setting, which is not part of the grid) finds the folder, skips all four and
    launches nothing."""
    args = ["sweep", "--config", CONFIG, "--out", str(tmp_path), "--name", "s", "--seeds", "2"]
    args += ["--launcher", "submitit_local", "filter.strategy=none,top_p", *SMALL, "trainer.iterations=1"]
    assert main(args) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert "4 runs, through Hydra's submitit_local launcher" in out and "4 finished, 0 already done, 0 failed" in out
    sweep = tmp_path / "s"
    runs = sorted(p.name for p in sweep.iterdir() if p.is_dir() and p.name not in ("hydra", "artifacts"))
    assert runs == [f"filter.strategy-{s}-seed{k}" for s in ("none", "top_p") for k in (0, 1)]
    tags = []
    for name in runs:
        point, seed = name.rsplit("-seed", 1)
        assert (sweep / name / DONE_MARKER).is_file()
        tags.append({"sweep": "s", "point": point.replace("-", "=", 1), "seed": seed})
        commands = [line for line in (sweep / name / LOG_NAME).read_text().splitlines() if line.startswith("$ ")]
        fit = re.escape(f"$ {sys.executable} -m ragen_lit fit --config {sweep / name}/config.yaml ")
        server = r"logging\.tracking_server=http://127\.0\.0\.1:\d+"
        assert len(commands) == 1 and re.fullmatch(fit + server, commands[0]), commands
    assert _tags(sweep) == sorted(tags, key=str)
    assert main([*args, "hydra.launcher.timeout_min=30"]) == 0
    assert "0 finished, 4 already done, 0 failed" in capsys.readouterr().out
    assert len(list((sweep / "hydra").iterdir())) == 1  # the first launch's records only
