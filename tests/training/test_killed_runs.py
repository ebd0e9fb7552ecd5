"""A `fit` killed before its first checkpoint (`run.killed_runs`): `trainer.resume=last` says in one line that there is
no checkpoint to resume and how to start afresh, and the killed run, which its process could not close, reads KILLED
in MLflow with the reason, once that later `fit` found it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from mlflow.tracking import MlflowClient
from tests.training.small_fit import CONFIG, SMALL

from ragen_lit.cli import main
from ragen_lit.run.loggers import STOPPED_TAG


def test_a_run_killed_before_its_first_checkpoint_reads_killed_and_resume_says_to_start_afresh(tmp_path, capsys):
    out = tmp_path / "runs"
    # a run whose first checkpoint is far away (no filter: no empty-filter stop ends it early)
    args = ["--config", CONFIG, *SMALL, "filter.strategy=none", "trainer.iterations=2000"]
    args += ["trainer.checkpoint_every=2000", f"logging.output_dir={out}"]
    killed = subprocess.Popen(
        [sys.executable, "-m", "ragen_lit", "fit", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        deadline = time.monotonic() + 300
        while not list(out.glob("*/run.json")):  # its MLflow run is open and it trains
            assert killed.poll() is None and time.monotonic() < deadline, killed.returncode
            time.sleep(0.2)
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
    (run,) = out.glob("frozenlake-*")
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlruns.db'}")
    (record,) = client.search_runs([client.get_experiment_by_name("ragen_lit").experiment_id])
    assert record.info.status == "RUNNING" and not list(run.glob("checkpoints/*"))  # as the kill left it

    assert main(["fit", *args, "trainer.resume=last"]) == 2
    assert capsys.readouterr().err == (
        f"error: trainer.resume=last: no checkpoint in {run} (the newest run named 'frozenlake-grpo-nofilter'; none "
        "of them has written one); start afresh with the same command without trainer.resume\n"
    )
    after = client.get_run(record.info.run_id)
    assert after.info.status == "KILLED" and after.info.end_time is not None
    assert after.data.tags[STOPPED_TAG].startswith(
        "killed: its process ended without closing the run, before its first checkpoint (found by a later fit at "
    )


def test_a_killed_run_of_a_store_behind_a_server_reads_killed_once_a_later_fit_through_that_server_found_it(tmp_path):
    """run.json names the store itself, never the server the run wrote through (`logging.tracking_server`, a sweep's):
    a later `fit` that writes that store through a server of its own finds the killed run and marks it there."""
    from ragen_lit.analysis.sweep_server import serving
    from ragen_lit.analysis.sweep_store import store_uri
    from ragen_lit.config import load_config
    from ragen_lit.run.folder import default_run_name
    from ragen_lit.run.killed_runs import mark_killed

    out, store = tmp_path / "run", store_uri(tmp_path)
    client = MlflowClient(tracking_uri=store)
    run_id = client.create_run(client.create_experiment("ragen_lit")).info.run_id  # left RUNNING, as a kill leaves it
    run = out / "frozenlake-grpo-nofilter-20261129-101010"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"mlflow_run_id": run_id, "tracking_uri": store}))
    args = ["filter.strategy=none", f"logging.output_dir={out}", f"logging.tracking_uri={store}"]
    with serving(tmp_path) as server:
        cfg = load_config(CONFIG, [*args, f"logging.tracking_server={server}"])
        mark_killed(cfg.logging, default_run_name(cfg))
    after = client.get_run(run_id)
    assert after.info.status == "KILLED" and after.data.tags[STOPPED_TAG].startswith(
        "killed: its process ended without closing the run, before its first checkpoint (found by a later fit at "
    )
