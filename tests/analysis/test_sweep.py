"""`python -m ragen_lit sweep`: the grid (Hydra's grammar), refusals before any run, and a real sweep of
2 grid points x 2 seeds x 2 iterations of the tiny model: tags, skip of finished runs, resume after a kill."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import mlflow
import pytest
import torch
from tests.analysis.sweep_servers import gone, server_ports

from ragen_lit.analysis import sweep_run
from ragen_lit.analysis.sweep import (
    Slot,
    device_queues,
    expand_grid,
    folder_name,
    launch,
    plan,
    point_label,
    slots,
    sweep_name,
)
from ragen_lit.analysis.sweep_checks import check_devices, check_placement
from ragen_lit.analysis.sweep_run import DONE_MARKER, exit_reason, status
from ragen_lit.analysis.sweep_store import store_uri
from ragen_lit.cli import main
from ragen_lit.config import load_config
from ragen_lit.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "conf" / "frozenlake.yaml")
SMALL = [
    "rollout.groups=2",
    "rollout.group_size=4",
    "rollout.max_turns=2",
    "rollout.max_new_tokens=32",
    "validation.num_envs=4",
    "validation.every_n_iterations=1",
    "diagnostics.num_samples=8",
    "optim.num_minibatches=1",
    "optim.micro_batch_size=8",
    "trainer.iterations=2",
    "trainer.checkpoint_every=1",
]


def test_expand_grid_is_the_cartesian_product_of_hydra_sweeps():
    fixed, points = expand_grid(
        ["filter.strategy=none,top_p", "trainer.iterations=3", "filter.value=range(0.5,1.0,0.25)"]
    )
    assert fixed == ["trainer.iterations=3"]
    assert points == [
        ["filter.strategy=none", "filter.value=0.5"],
        ["filter.strategy=none", "filter.value=0.75"],
        ["filter.strategy=top_p", "filter.value=0.5"],
        ["filter.strategy=top_p", "filter.value=0.75"],
    ]
    assert expand_grid(["env.options.p=choice(0.8,0.9)"])[1] == [["env.options.p=0.8"], ["env.options.p=0.9"]]
    assert expand_grid(["trainer.iterations=3"]) == (["trainer.iterations=3"], [[]])


def test_labels_and_folders_are_readable_and_safe():
    point = ["filter.strategy=top_p", "env.options.p=0.9"]
    assert point_label(point) == "filter.strategy=top_p,env.options.p=0.9"
    assert point_label([]) == "base"
    assert folder_name(point, 3) == "filter.strategy-top_p_env.options.p-0.9-seed3"
    assert folder_name(["model.path=/a b/c"], 0) == "model.path-abc-seed0"
    assert sweep_name("conf/frozenlake.yaml", ["a=1,2"], 4) == sweep_name("x/frozenlake.yml", ["a=1,2"], 4)
    assert sweep_name("conf/frozenlake.yaml", ["a=1,2"], 4) != sweep_name("conf/frozenlake.yaml", ["a=1,2"], 5)


@pytest.mark.parametrize(
    ("overrides", "seeds", "message"),
    [
        (
            ["filter.strategy=none,bogus"],
            1,
            "grid point 'filter.strategy=bogus': filter.strategy='bogus' is not allowed",
        ),
        (["filter.nosuchkey=1,2"], 1, "grid point 'filter.nosuchkey=1': filter.nosuchkey: unknown key"),
        (["nosection.x=1"], 1, "unknown section 'nosection'"),
        (["filter.value=range(0.5"], 1, "sweep grid:"),
        (["trainer.seed=0,1"], 1, "trainer.seed: the sweep sets it"),
        ([], 0, "--seeds 0"),
        # at most 10,000 runs, refused before a point is made
        ([], 100_000_000, "--seeds 100000000: a sweep makes at most 10,000 runs (grid points x seeds)"),
        (["rollout.groups=range(1,1000000000)"], 1, "rollout.groups=range(1,1000000000): more than 10,000 values"),
        (
            ["filter.value=range(0.01,1.0,0.01)", "algo=grpo,gigpo"],
            60,
            "sweep grid: filter.value (99 values) x algo (2 values) = 198 grid point(s) x --seeds 60 = 11,880 runs; a "
            "sweep makes at most 10,000 runs",
        ),
    ],
)
def test_a_bad_grid_is_refused_before_any_run(tmp_path, overrides, seeds, message):
    with pytest.raises(ConfigError) as error:
        plan(CONFIG, overrides, seeds, tmp_path, "s")
    assert message in str(error.value) and "\n" not in str(error.value)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("config", ["frozenlake.yaml", "sokoban.yaml"])
def test_the_grpo_vs_gigpo_grid_plans_on_the_envs_with_anchor_states(tmp_path, config):
    runs = plan(str(Path(CONFIG).parent / config), ["algo=grpo,gigpo"], 8, tmp_path, "s")
    assert len(runs) == 16
    algos = [run.config.algo for run in runs]
    assert [a.advantage for a in algos] == ["grpo"] * 8 + ["gigpo"] * 8
    assert all(a.turn_level_rewards == (a.advantage == "gigpo") for a in algos)
    with pytest.raises(ConfigError, match=r"grid point 'algo=gigpo': algo.advantage=gigpo needs anchor states"):
        plan(str(Path(CONFIG).parent / "countdown.yaml"), ["algo=grpo,gigpo"], 1, tmp_path / "c", "s")


def test_the_cli_refuses_a_bad_grid_with_one_line(tmp_path, capsys):
    assert main(["sweep", "--config", CONFIG, "--out", str(tmp_path), "filter.strategy=none,nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "filter.strategy='nope' is not allowed" in err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seeds", "100000000"], "error: --seeds 100000000: a sweep makes at most 10,000 runs"),
        (["rollout.groups=range(1,1000000000)"], "more than 10,000 values"),
        # fit's checks on every grid point, before the first run starts
        (
            ["rollout.groups=2,1000000000"],
            "error: grid point 'rollout.groups=1000000000': rollout.groups=1000000000 x rollout.group_size=8 = "
            "8000000000 episodes of up to rollout.max_context_tokens=2048 tokens need up to",
        ),
        (["model.path=/no/a,/no/b"], "error: grid point 'model.path=/no/a': model.path='/no/a': no such folder"),
        (
            ["env.options.size=4,3000"],
            "error: grid point 'env.options.size=3000': env.options.p=0.8, env.options.size=3000",
        ),
        (["--threads-per-run", "1000000"], "error: --threads-per-run 1000000: this machine has"),
        # runs for another machine: the checks that need none
        (
            ["--print-commands", "env.options.size=4,3000"],
            "grid point 'env.options.size=3000': env.options.p=0.8, env.options.size=3000",
        ),
    ],
)
def test_a_sweep_refuses_in_one_line_before_any_run_starts(tmp_path, capsys, args, message):
    assert main(["sweep", "--config", CONFIG, "--out", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert list(tmp_path.iterdir()) == []


def test_runs_printed_for_another_machine_are_not_held_to_this_ones_memory(tmp_path, capsys):
    args = ["sweep", "--config", CONFIG, "--out", str(tmp_path), "--name", "s", "--print-commands"]
    assert main([*args, "rollout.groups=2,1000000000"]) == 0
    assert capsys.readouterr().out.count(" fit --config ") == 2


def test_the_help_states_how_many_runs_a_sweep_makes(capsys):
    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    assert "a sweep makes at most 10,000 runs: grid points x seeds" in " ".join(capsys.readouterr().out.split())


def test_slots_pin_each_run_to_its_own_cores_or_gpu():
    cores = sorted(os.sched_getaffinity(0))
    pool = slots(None, 1, None)
    assert len(pool) == len(cores) and [s.cores for s in pool] == [(c,) for c in cores]
    assert [s.gpu for s in slots(None, 1, ["0", "1"])] == ["0", "1"]
    assert len(slots(3, 1, None)) == 3


def test_runs_that_share_a_gpu_get_equal_shares_of_its_memory():
    """Three runs on GPU 0 get 0.95 / 3 of it each; the run alone on GPU 1 and CPU slots get no cap."""
    pool = slots(None, 1, ["0", "0", "1", "0"])
    assert [(s.gpu, s.memory_share) for s in pool] == [("0", 0.317), ("0", 0.317), ("1", None), ("0", 0.317)]
    assert all(s.memory_share is None for s in slots(2, 1, None))


@pytest.mark.parametrize(
    ("grid", "share", "cap"),
    [
        ([], 0.317, "trainer.gpu_memory_fraction=0.317"),  # shared GPU: the sweep's share
        ([], None, None),  # a GPU of its own: no cap
        (["trainer.gpu_memory_fraction=0.5"], 0.317, None),  # the grid's own cap is kept (it is in config.yaml)
    ],
)
def test_a_run_on_a_shared_gpu_is_capped_at_its_share(tmp_path, monkeypatch, grid, share, cap):
    (spec,) = plan(CONFIG, grid, 1, tmp_path, "s")
    seen, real_popen = {}, subprocess.Popen

    def popen(command, env, **kwargs):
        seen.update(command=command)
        return real_popen([sys.executable, "-c", "pass"])

    monkeypatch.setattr(subprocess, "Popen", popen)
    spec.folder.mkdir(parents=True)
    process = launch(spec, Slot((0,), "0", share))
    process.wait()
    process.log.close()
    caps = [arg for arg in seen["command"] if arg.startswith("trainer.gpu_memory_fraction=")]
    assert caps == ([cap] if cap else [])


@pytest.mark.parametrize(
    ("devices", "points", "seeds"), [(["0", "0", "1", "1"], 2, 8), (["0", "1"], 2, 3), (["0", "1", "2"], 3, 6)]
)
def test_conditions_share_every_gpu(tmp_path, monkeypatch, devices, points, seeds):
    """Every GPU runs every grid point (as evenly as the counts allow), whatever the order of the grid, and the
    runs start in that placement, points alternating in time: a condition is never one card's."""
    from ragen_lit.analysis import sweep as sweep_module

    values = ",".join(["none", "top_p", "top_k"][:points])
    specs = plan(CONFIG, [f"filter.strategy={values}"], seeds, tmp_path, "s")
    pool = slots(None, 1, devices)
    queues = device_queues(specs, pool)
    assert sorted(s.folder for q in queues.values() for s in q) == sorted(s.folder for s in specs)
    for gpu, queue in queues.items():
        per_point = Counter(spec.point for spec in queue)
        assert len(per_point) == points, (gpu, per_point)  # every condition on every card
        assert max(per_point.values()) - min(per_point.values()) <= 1, (gpu, per_point)
        assert [spec.seed for spec in queue] == sorted(spec.seed for spec in queue)  # seed order, points alternate
    started = []
    for spec in specs:
        spec.folder.mkdir(parents=True)
    monkeypatch.setattr(sweep_run, "fit_command", lambda folder, resume: [sys.executable, "-c", "pass"])
    real_launch = sweep_module.launch
    monkeypatch.setattr(
        sweep_module,
        "launch",
        lambda spec, slot, server: started.append((spec, slot)) or real_launch(spec, slot, server),
    )
    sweep_module.run_all(specs, pool, say=lambda _: None)
    assert sorted((spec.folder, slot.gpu) for spec, slot in started) == sorted(
        (spec.folder, gpu) for gpu, queue in queues.items() for spec in queue
    )
    first = [spec.point for spec, _ in started[: len(pool)]]
    assert len(set(first)) == points  # the first wave already holds every condition


def test_a_gpu_with_more_free_slots_than_runs_starts_them_all(tmp_path, monkeypatch):
    from ragen_lit.analysis import sweep as sweep_module

    specs = plan(CONFIG, ["filter.strategy=none,top_p"], 1, tmp_path, "s")
    for spec in specs:
        spec.folder.mkdir(parents=True)
    monkeypatch.setattr(sweep_run, "fit_command", lambda folder, resume: [sys.executable, "-c", "pass"])
    counts = sweep_module.run_all(specs, slots(None, 1, ["0", "0", "0", "1"]), say=lambda _: None)
    assert counts == {"skipped": 0, "finished": 2, "failed": 0}


def test_a_restart_from_scratch_keeps_the_failed_attempts_log(tmp_path, monkeypatch):
    """A run that failed before its first checkpoint starts clean (its MLflow store and run folder go), but its
    log stays and the new attempt appends to it: the reason it failed is not lost."""
    (spec,) = plan(CONFIG, [], 1, tmp_path, "s")
    real_popen = subprocess.Popen
    monkeypatch.setattr(subprocess, "Popen", lambda command, env, **kw: real_popen([sys.executable, "-c", "pass"]))
    spec.folder.mkdir(parents=True)
    (spec.folder / "config.yaml").write_text("kept: yes\n")
    (spec.folder / "sweep.log").write_text("$ fit ...\nSegmentation fault")  # no final newline, as a crash leaves it
    (spec.folder / "mlruns.db").write_text("half a run")
    (spec.folder / "frozenlake-grpo-top_p0.9-20261127").mkdir()
    assert status(spec.folder) != "resume"  # no checkpoint: nothing to resume
    process = launch(spec, Slot((0,)))
    process.wait()
    process.log.close()
    assert sorted(p.name for p in spec.folder.iterdir()) == ["config.yaml", "sweep.log"]
    log = (spec.folder / "sweep.log").read_text().splitlines()
    assert log[:2] == ["$ fit ...", "Segmentation fault"] and log[2].startswith("$ ")


def test_a_crashed_run_is_reported_and_the_same_command_retries_it(tmp_path, monkeypatch, capsys):
    """One run dies of a segmentation fault: the sweep names the signal, says how to retry, stops its MLflow server
    and fails; run again it skips the finished run, retries the crashed one afresh (the MLflow run its attempt left in
    the sweep's store deleted, the finished run's kept), and that run's log keeps both attempts."""
    from ragen_lit.analysis import sweep as sweep_module

    crash = {"filter.strategy-top_p-seed0": True}
    points = ("filter.strategy=none", "filter.strategy=top_p")

    def fake_fit(folder, resume):
        code = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)" if crash.get(folder.name) else "pass"
        return [sys.executable, "-c", code]

    monkeypatch.setattr(sweep_run, "fit_command", fake_fit)
    args = (CONFIG, ["filter.strategy=none,top_p"])
    options = {"parallel": 1, "out": str(tmp_path), "name": "s"}
    assert sweep_module.run_sweep(*args, **options) == 1
    out = capsys.readouterr().out
    assert "FAILED  filter.strategy=top_p seed 0 (killed by SIGSEGV;" in out
    assert "1 finished, 0 already done, 1 failed" in out and "the same command again retries the failed runs" in out
    crashed = tmp_path / "s" / "filter.strategy-top_p-seed0"
    assert (crashed / sweep_run.FAILED_MARKER).read_text() == "killed by SIGSEGV\n"
    (port,) = server_ports(tmp_path / "s")
    assert f"through MLflow's server at http://127.0.0.1:{port}" in out and gone(port, within_s=0)
    client = mlflow.tracking.MlflowClient(store_uri(tmp_path / "s"))
    experiment = client.get_experiment_by_name("ragen_lit").experiment_id
    left = {point: client.create_run(experiment, tags={"point": point, "seed": "0"}).info.run_id for point in points}
    crash.clear()
    assert sweep_module.run_sweep(*args, **options) == 0
    assert "1 finished, 1 already done, 0 failed" in capsys.readouterr().out
    log = (crashed / "sweep.log").read_text()
    assert log.count("$ ") == 2  # both attempts' commands, the crashed one first
    assert not (crashed / sweep_run.FAILED_MARKER).exists() and (crashed / DONE_MARKER).is_file()
    assert client.get_run(left["filter.strategy=top_p"]).info.lifecycle_stage == "deleted"
    assert client.get_run(left["filter.strategy=none"]).info.lifecycle_stage == "active"


def test_a_run_begun_in_a_store_of_its_own_resumes_there_beside_new_runs_in_the_sweeps(tmp_path, monkeypatch):
    """A sweep folder from before sweeps shared a store: its run with a checkpoint and its own mlruns.db resumes there
    (its config names no store, its command no server), while a new run writes the sweep's store through the server."""
    fit = [sys.executable, "-c", "pass"]
    monkeypatch.setattr(sweep_run, "fit_command", lambda folder, resume: fit + ["trainer.resume=last"] * resume)
    sweep = tmp_path / "s"
    old, new = sweep / "filter.strategy-none-seed0", sweep / "filter.strategy-top_p-seed0"
    (old / "frozenlake-grpo-nofilter-20261128-120000" / "checkpoints").mkdir(parents=True)
    (old / "frozenlake-grpo-nofilter-20261128-120000" / "checkpoints" / "last.ckpt").write_text("weights")
    (old / "mlruns.db").write_bytes(b"")
    args = ["sweep", "--config", CONFIG, "--out", str(tmp_path), "--name", "s", "--parallel", "1"]
    assert main([*args, "filter.strategy=none,top_p"]) == 0
    assert load_config(str(old / "config.yaml")).logging.tracking_uri is None
    assert load_config(str(new / "config.yaml")).logging.tracking_uri == store_uri(sweep)
    (old_command,) = [line for line in (old / "sweep.log").read_text().splitlines() if line.startswith("$ ")]
    (new_command,) = [line for line in (new / "sweep.log").read_text().splitlines() if line.startswith("$ ")]
    assert "trainer.resume=last" in old_command and "logging.tracking_server" not in old_command
    assert new_command.endswith(f"logging.tracking_server=http://127.0.0.1:{server_ports(sweep)[0]}")


def test_ctrl_c_stops_the_sweeps_mlflow_server(tmp_path, monkeypatch, capsys):
    """Ctrl-C while the runs start (SIGINT to the sweep's process): the command ends with 130, and the MLflow server it
    started for its runs is gone, its log kept in the sweep folder."""
    from ragen_lit.analysis import sweep as sweep_module

    def ctrl_c(spec, slot, server):
        signal.raise_signal(signal.SIGINT)
        time.sleep(60)  # Python raises KeyboardInterrupt at its next check, within this

    monkeypatch.setattr(sweep_module, "launch", ctrl_c)
    args = ["sweep", "--config", CONFIG, "--out", str(tmp_path), "--name", "s", "filter.strategy=none,top_p"]
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's, as `python -m ragen_lit` has it
    try:
        assert main(args) == 130
    finally:
        signal.signal(signal.SIGINT, previous)  # whatever an earlier test's library left
    assert capsys.readouterr().err.startswith("interrupted: ")
    (port,) = server_ports(tmp_path / "s")
    assert gone(port, within_s=0)


@pytest.mark.parametrize(
    ("code", "reason"), [(0, "exit 0"), (1, "exit 1"), (-11, "killed by SIGSEGV"), (-9, "killed by SIGKILL")]
)
def test_a_failed_runs_exit_is_named(code, reason):
    assert exit_reason(code) == reason


@pytest.mark.parametrize(("slot", "visible", "placement"), [(Slot((0,)), "", "cpu"), (Slot((0,), "2"), "2", "gpu")])
def test_a_run_sees_its_gpu_or_none(tmp_path, monkeypatch, slot, visible, placement):
    """A CPU slot hides every GPU and says cpu (`auto` once put all of a sweep's CPU runs on GPU 0, in bfloat16);
    a GPU slot sees its own GPU only."""
    (spec,) = plan(CONFIG, [], 1, tmp_path, "s")
    seen, real_popen = {}, subprocess.Popen

    def popen(command, env, **kwargs):
        seen.update(command=command, env=env)
        return real_popen([sys.executable, "-c", "pass"])

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.setattr(subprocess, "Popen", popen)
    spec.folder.mkdir(parents=True)
    process = launch(spec, slot)
    process.wait()
    process.log.close()
    assert seen["env"]["CUDA_VISIBLE_DEVICES"] == visible
    assert f"trainer.accelerator={placement}" in seen["command"]


@pytest.mark.parametrize(
    ("devices", "visible", "message"),
    [
        (["0"], 0, "--devices 0: this machine has no usable CUDA GPU; drop --devices to run on CPU cores"),
        (["0", "4"], 4, "--devices 0,4: no GPU '4' here; this machine has 4 (ids 0..3, or GPU UUIDs)"),
        (["0", "x"], 2, "--devices 0,x: no GPU 'x' here"),
    ],
)
def test_devices_the_machine_lacks_are_refused(devices, visible, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_devices(devices, visible)


def test_devices_the_machine_has_pass():
    check_devices(None, 0)  # CPU runs
    check_devices(["0", "0", "3"], 4)
    check_devices(["GPU-d76a64da-1b53-fca2-b1c9-7741648bfaf0"], 1)  # a UUID is CUDA_VISIBLE_DEVICES's business


def test_a_sweep_on_gpus_the_machine_lacks_starts_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert main(["sweep", "--config", CONFIG, "--out", str(tmp_path), "--devices", "0", "trainer.iterations=1"]) == 2
    assert "no usable CUDA GPU" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # no run folder, no config written


@pytest.mark.parametrize(
    ("grid", "devices", "message"),
    [
        (
            ["trainer.accelerator=gpu"],
            None,
            "accelerator=gpu but the sweep runs on CPU cores (no --devices); add --devices",
        ),
        (["trainer.accelerator=cpu"], ["0"], "accelerator=cpu but the sweep runs on GPUs (--devices); drop --devices"),
    ],
)
def test_a_run_placed_against_its_accelerator_is_refused(tmp_path, grid, devices, message):
    specs = plan(CONFIG, grid, 1, tmp_path, "s")
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_placement(specs, devices)
    check_placement(plan(CONFIG, [], 1, tmp_path / "auto", "s"), devices)  # auto goes wherever the sweep puts it


def test_print_commands_writes_each_runs_config(tmp_path, capsys):
    assert (
        main(
            [
                "sweep",
                "--config",
                CONFIG,
                "--out",
                str(tmp_path),
                "--name",
                "s",
                "--seeds",
                "2",
                "--print-commands",
                "filter.strategy=none,top_p",
                *SMALL,
            ]
        )
        == 0
    )
    commands = capsys.readouterr().out.splitlines()
    assert len(commands) == 4 and all(c.endswith("config.yaml") and " fit --config " in c for c in commands)
    run = tmp_path / "s" / "filter.strategy-top_p-seed1"
    cfg = load_config(str(run / "config.yaml"))
    assert cfg.trainer.seed == 1 and cfg.filter.strategy == "top_p" and cfg.logging.output_dir == str(run)
    assert cfg.logging.tags == {"sweep": "s", "point": "filter.strategy=top_p", "seed": "1"}
    assert cfg.trainer.threads == 1 and cfg.trainer.iterations == 2


def _sweep_command(out: Path, model_dir: Path, parallel: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "ragen_lit",
        "sweep",
        "--config",
        CONFIG,
        "--out",
        str(out),
        "--name",
        "s",
        "--seeds",
        "2",
        "--parallel",
        str(parallel),
        "filter.strategy=none,top_p",
        f"model.path={model_dir}",
        *SMALL,
    ]


RUNS = [f"filter.strategy-{value}-seed{seed}" for value in ("none", "top_p") for seed in (0, 1)]
"""the folders of the grid's runs, `<point>-seed<k>`"""


def _runs(sweep: Path):
    """The sweep's runs as MLflow's own search gives them: one experiment of the sweep's one store."""
    mlflow.set_tracking_uri(store_uri(sweep))
    try:
        return mlflow.search_runs(experiment_names=["ragen_lit"])
    finally:
        mlflow.set_tracking_uri(None)


def _rows(sweep: Path) -> dict[tuple[str, str], dict[str, int]]:
    """How many metric rows each run of the sweep's store holds, per key, by (point, seed)."""
    client = mlflow.tracking.MlflowClient(store_uri(sweep))
    experiment = client.get_experiment_by_name("ragen_lit").experiment_id
    return {
        (run.data.tags["point"], run.data.tags["seed"]): {
            key: len(client.get_metric_history(run.info.run_id, key)) for key in run.data.metrics
        }
        for run in client.search_runs([experiment])
    }


@dataclass(frozen=True)
class Killed:
    """The grid run one at a time, its sweep killed once and started again (`one_at_a_time`)."""

    sweep: Path
    finished_before: set[str]
    """the runs that had finished when the sweep was killed"""
    resumed: set[str]
    """the run that had written a checkpoint but not finished"""
    output: str
    """what the second sweep printed"""


@pytest.fixture(scope="module")
def one_at_a_time(tmp_path_factory, tiny_model_dir) -> Killed:
    """2 grid points x 2 seeds x 2 iterations of the tiny model, one run at a time; the whole sweep (its runs with it)
    killed with SIGKILL once one run finished and the next wrote a checkpoint, then the same command again."""
    out = tmp_path_factory.mktemp("one_at_a_time")
    sweep = out / "s"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    first = subprocess.Popen(
        _sweep_command(out, tiny_model_dir, parallel=1),
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        done = list(sweep.glob(f"*/{DONE_MARKER}"))
        partial = [p for p in sweep.glob("*/*/checkpoints/last.ckpt") if not (p.parents[2] / DONE_MARKER).exists()]
        if done and partial:
            break
        assert first.poll() is None, first.stdout.read()
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    finished_before = {p.parent.name for p in sweep.glob(f"*/{DONE_MARKER}")}
    resumed = {p.parents[2].name for p in partial}
    second = subprocess.run(
        _sweep_command(out, tiny_model_dir, parallel=1), env=env, capture_output=True, text=True, timeout=900
    )
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    return Killed(sweep, finished_before, resumed, second.stdout)


@pytest.mark.slow
def test_a_sweep_runs_tags_skips_finished_runs_and_resumes_after_a_kill(one_at_a_time):
    """The second sweep skips the finished runs and resumes the killed one under a server of its own (the first went
    with the killed sweep); every run is one MLflow run of the sweep's one experiment, finished, with its tags, and
    its run.json names the store, not a server."""
    sweep = one_at_a_time.sweep
    assert f"{len(one_at_a_time.finished_before)} already done" in one_at_a_time.output
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir() and p.name != "artifacts") == RUNS
    for name in RUNS:
        folder = sweep / name
        assert (folder / DONE_MARKER).is_file()
        log = (folder / "sweep.log").read_text()
        commands = [line for line in log.splitlines() if line.startswith("$ ")]
        if name in one_at_a_time.finished_before:
            assert len(commands) == 1  # never started again
        if name in one_at_a_time.resumed:
            assert "trainer.resume=last" in commands[-1].split()
        (record,) = folder.glob("*/run.json")
        assert json.loads(record.read_text())["tracking_uri"] == store_uri(sweep)
    table = _runs(sweep)
    assert len(table) == len(RUNS)  # a resumed run continues its MLflow run
    for row in table.to_dict("records"):
        point = row["tags.point"]
        assert f"{point.replace('=', '-')}-seed{row['tags.seed']}" in RUNS and row["tags.sweep"] == "s"
        assert row["params.filter.strategy"] == point.split("=")[1] and row["params.trainer.seed"] == row["tags.seed"]
        assert row["status"] == "FINISHED" and row["metrics.summary/iterations"] == 2
    ports = server_ports(sweep)
    assert len(ports) == 2 and all(gone(port) for port in ports)  # the killed sweep's server and the second's


@pytest.mark.slow
def test_two_runs_at_a_time_write_the_rows_of_one_at_a_time(one_at_a_time, tmp_path, tiny_model_dir):
    """The same grid with two runs at a time through the sweep's server: every run holds as many rows of every metric
    as the same run written one at a time (and resumed once), side by side in one experiment; the server is gone."""
    done = subprocess.run(
        _sweep_command(tmp_path, tiny_model_dir, parallel=2), capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "4 runs, 2 at a time" in done.stdout
    rows = _rows(tmp_path / "s")
    assert rows == _rows(one_at_a_time.sweep)
    assert len(rows) == len(RUNS) and all(counts["val/success"] == 3 for counts in rows.values())
    table = _runs(tmp_path / "s")
    assert sorted(zip(table["params.filter.strategy"], table["tags.seed"])) == [
        (value, seed) for value in ("none", "top_p") for seed in ("0", "1")
    ]
    (port,) = server_ports(tmp_path / "s")
    assert gone(port, within_s=0)


@pytest.mark.slow
def test_a_finished_sweep_is_compared_and_its_runs_evaluated_without_its_server(one_at_a_time, capsys):
    """Once the sweep and its server have ended: `compare` reads the sweep's store, and `evaluate` of its resumed run
    logs the evaluation beside the run in that store."""
    sweep = one_at_a_time.sweep
    assert main(["compare", str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "| filter.strategy=none | 2 |" in out and "| filter.strategy=top_p | 2 |" in out
    (name,) = one_at_a_time.resumed
    run = sweep / name
    (record,) = run.glob("*/run.json")
    assert main(["evaluate", "--model", str(record.parent), "--episodes", "2"]) == 0
    (report,) = record.parent.glob("evaluations/*.json")
    (logged,) = json.loads(report.read_text())["mlflow"]
    assert logged["tracking_uri"] == store_uri(sweep)
    evaluation = mlflow.tracking.MlflowClient(store_uri(sweep)).get_run(logged["run_id"])
    assert evaluation.data.tags["seed"] == run.name[-1] and evaluation.data.tags["sweep"] == "s"


def test_a_second_sweep_on_a_locked_folder_is_refused_and_a_killed_holder_leaves_no_lock(tmp_path, monkeypatch, capsys):
    """Another process holds the sweep folder's lock: the sweep is refused in one line naming it and starts nothing;
    once that process is killed the same command runs."""
    monkeypatch.setattr(sweep_run, "fit_command", lambda folder, resume: [sys.executable, "-c", "pass"])
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from ragen_lit.analysis.sweep_lock import sweep_lock\n"
            f"with sweep_lock(Path({str(tmp_path / 's')!r})):\n    print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        args = ["sweep", "--config", CONFIG, "--out", str(tmp_path), "--name", "s", "filter.strategy=none,top_p"]
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert err.startswith(f"error: sweep folder {tmp_path / 's'} is in use by another sweep (pid {holder.pid}, ")
        assert err.endswith("); wait for it to end, or give this one another --name or --out\n")
        assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["sweep.lock"]  # no run was written or started
    finally:
        holder.kill()
        holder.wait()
    assert main(args) == 0
    assert "2 finished, 0 already done, 0 failed" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["../elsewhere", "a/b", ".."])
def test_a_sweep_name_stays_inside_its_out_folder(tmp_path, name, capsys):
    assert main(["sweep", "--config", CONFIG, "--out", str(tmp_path / "sweeps"), "--name", name]) == 2
    assert capsys.readouterr().err.startswith(f"error: --name {name!r}: give a plain folder name")
    assert list(tmp_path.iterdir()) == []


def hold_elsewhere(run: Path) -> subprocess.Popen:
    """Another process that holds `run` (`run.lock.hold`, as a fit does) until it is killed; it prints "held" once
    the lock is taken."""
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from ragen_lit.run.lock import hold\n"
            f"lock = hold(Path({str(run)!r})); print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("checkpoint", [False, True])
def test_a_run_that_a_fit_of_its_own_trains_is_left_alone_and_taken_up_once_it_ended(
    tmp_path, monkeypatch, capsys, checkpoint
):
    """A run folder of the sweep's first run is held by another process (`run.lock`, as a fit a killed sweep left
    would hold it): the sweep neither starts that run nor clears or resumes its folder (with a checkpoint or without),
    reports it failed naming that process, and runs the others; once that process ended the same command runs it."""
    monkeypatch.setattr(sweep_run, "fit_command", lambda folder, resume: [sys.executable, "-c", "pass"])
    run = tmp_path / "s" / "filter.strategy-none-seed0" / "frozenlake-grpo-top_p0.9-20261129-101010"
    (run / "checkpoints").mkdir(parents=True)
    (run.parent / "mlruns.db").write_text("the run's store")
    if checkpoint:
        (run / "checkpoints" / "last.ckpt").write_text("weights")
    holder = hold_elsewhere(run)
    args = ["sweep", "--config", CONFIG, "--out", str(tmp_path), "--name", "s", "filter.strategy=none,top_p"]
    try:
        assert holder.stdout.readline() == "held\n"
        before = sorted(p.name for p in run.rglob("*"))
        assert main([*args, "--parallel", "1"]) == 1
        out = capsys.readouterr().out
        busy = f"run folder {run} is being trained by another process (pid {holder.pid}, "
        assert f"FAILED  filter.strategy=none seed 0 ({busy}" in out, out
        assert "done    filter.strategy=top_p seed 0" in out and "1 finished, 0 already done, 1 failed" in out
        assert sorted(p.name for p in run.rglob("*")) == before and (run.parent / "mlruns.db").is_file()
        assert f"not started: {busy}" in (run.parent / "sweep.log").read_text()
    finally:
        holder.kill()
        holder.wait()
    assert main(args) == 0
    assert "1 finished, 1 already done, 0 failed" in capsys.readouterr().out


def test_the_mlflow_run_of_a_run_that_a_fit_of_its_own_trains_is_not_deleted_from_the_sweeps_store(
    tmp_path, monkeypatch, capsys
):
    """A run a `fit` of its own trains (`run.lock`) before its first checkpoint, into the sweep's store: the sweep
    leaves its MLflow run alone (that fit still writes it), while an earlier attempt of a run it starts afresh is
    deleted (each run of the sweep is one MLflow run)."""
    monkeypatch.setattr(sweep_run, "fit_command", lambda folder, resume: [sys.executable, "-c", "pass"])
    sweep = tmp_path / "s"
    run = sweep / "filter.strategy-none-seed0" / "frozenlake-grpo-top_p0.9-20261129-101010"
    run.mkdir(parents=True)
    client = mlflow.MlflowClient(tracking_uri=store_uri(sweep))
    experiment = client.create_experiment("ragen_lit")
    held, earlier = (
        client.create_run(experiment, tags={"point": point, "seed": "0"}).info.run_id
        for point in ("filter.strategy=none", "filter.strategy=top_p")
    )
    holder = hold_elsewhere(run)
    args = ["sweep", "--config", CONFIG, "--out", str(tmp_path), "--name", "s", "filter.strategy=none,top_p"]
    try:
        assert holder.stdout.readline() == "held\n"
        assert main([*args, "--parallel", "1"]) == 1
        assert "1 finished, 0 already done, 1 failed" in capsys.readouterr().out
    finally:
        holder.kill()
        holder.wait()
    assert client.get_run(held).info.lifecycle_stage == "active"
    assert client.get_run(earlier).info.lifecycle_stage == "deleted"
