"""A sweep's one MLflow store and the server its runs write it through (`sweep_store`, `sweep_server`): which store a
run writes, a real `mlflow server` taking four writers at once without losing a row, stopped however its block ends,
and started again on another port when the one it was given is taken."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient
from tests.analysis.sweep_servers import gone, server_ports

from ragen_lit.analysis import sweep_server
from ragen_lit.analysis.sweep_server import serving
from ragen_lit.analysis.sweep_store import check_store, prepare_store, run_store, store_uri

WRITERS, STEPS, KEYS = 4, 40, 5
WRITER = """
import sys
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

server, experiment, name, steps, keys = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
client = MlflowClient(server)
run_id = client.create_run(experiment, run_name=name).info.run_id
for step in range(steps):
    client.log_batch(run_id, metrics=[Metric(f"batch/{k}", step * k, 0, step) for k in range(keys)])
    client.log_metric(run_id, "single", step, step=step)
client.set_terminated(run_id)
"""
"""a run as a process of its own: every step a batch of `keys` metrics and one more metric by itself"""
HOLDER = """
import sys, time
from pathlib import Path
from ragen_lit.analysis.sweep_server import serving

with serving(Path(sys.argv[1])) as server:
    print(server, flush=True)
    time.sleep(600)
"""
"""a sweep as far as its server goes: it serves, then waits to be killed"""


def test_a_new_run_writes_the_sweeps_store_and_a_begun_run_keeps_the_one_it_began_in(tmp_path):
    folder = tmp_path / "filter.strategy-none-seed0"
    folder.mkdir()
    shared = store_uri(tmp_path)
    assert run_store(folder, began=False, shared=True) == shared
    assert run_store(folder, began=False, shared=False) is None  # runs sent to other machines: a store each
    assert run_store(folder, began=True, shared=False) == shared  # begun in the sweep's store: it stays there
    (folder / "mlruns.db").write_bytes(b"")  # a store of its own, as sweeps wrote them before they shared one
    assert run_store(folder, began=True, shared=True) is None
    assert run_store(folder, began=False, shared=True) == shared  # a fresh start clears the folder, that store too


@pytest.mark.slow
def test_four_writers_at_once_lose_no_row_and_the_server_stops_when_its_block_raises(tmp_path):
    check_store(tmp_path)
    with pytest.raises(RuntimeError, match="a run failed"), serving(tmp_path) as server:
        prepare_store(server, tmp_path, ["ragen_lit"], [])
        experiment = MlflowClient(server).get_experiment_by_name("ragen_lit").experiment_id
        writers = [
            subprocess.Popen([sys.executable, "-c", WRITER, server, experiment, f"w{i}", str(STEPS), str(KEYS)])
            for i in range(WRITERS)
        ]
        assert [writer.wait(timeout=600) for writer in writers] == [0] * WRITERS
        raise RuntimeError("a run failed")
    (port,) = server_ports(tmp_path)
    assert gone(port, within_s=0)
    client = MlflowClient(store_uri(tmp_path))  # the store itself, its server gone
    assert client.get_experiment(experiment).artifact_location == (tmp_path / "artifacts").as_uri()
    runs = client.search_runs([experiment])
    assert sorted(run.info.run_name for run in runs) == [f"w{i}" for i in range(WRITERS)]
    for run in runs:
        assert run.info.status == "FINISHED"
        for key in ["single", *(f"batch/{k}" for k in range(KEYS))]:
            history = client.get_metric_history(run.info.run_id, key)
            assert sorted(metric.step for metric in history) == list(range(STEPS)), (run.info.run_name, key)


@pytest.mark.slow
def test_a_server_whose_port_was_taken_meanwhile_starts_again_on_another(tmp_path, monkeypatch):
    """The port found free is taken before the server binds it: that server exits, and the next start, on another
    port, serves; both starts are in the server's log."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = [taken.getsockname()[1], sweep_server.free_port()]
        monkeypatch.setattr(sweep_server, "free_port", lambda: ports.pop(0))
        with serving(tmp_path) as server:
            assert server.endswith(f":{server_ports(tmp_path)[-1]}") and sweep_server.answers(server)
        assert len(server_ports(tmp_path)) == 2 and all(gone(port, within_s=0) for port in server_ports(tmp_path)[1:])


@pytest.mark.floors
def test_a_sweep_killed_outright_takes_its_server_with_it(tmp_path):
    """SIGKILL to the sweep's process, which runs no code of its own after it: the kernel tells the server (its
    parent died), the server stops its uvicorn and exits. (MLflow from 3.10 passes the signal on to uvicorn, which is
    why it is the floor.)"""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    server = holder.stdout.readline().strip()
    assert server.startswith("http://127.0.0.1:"), server
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert gone(int(server.rsplit(":", 1)[1]))
