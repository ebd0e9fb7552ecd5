"""The MLflow tracking server a sweep's runs write its store through, for as long as the sweep runs them.

`serving(sweep)` starts `mlflow server` on the sweep's store (`sweep_store`), bound to a free port of 127.0.0.1 (no
other machine can reach it), with one worker (the one process that writes the sqlite file) and without MLflow's
job runner or artifact proxy (the runs write their artifacts to `<sweep>/artifacts` themselves, a folder that stays
readable once the server is gone); it waits until the server answers its health check, hands its address to the
block, and stops the server when the block ends, however it ends: the runs done, a run failed, an error, Ctrl-C. A
sweep killed outright takes the server with it: the server is sent SIGTERM when the sweep's process dies (Linux's
parent-death signal), which `mlflow server` (from MLflow 3.10, the floor) passes on to its uvicorn process before it
exits. The server's output,
each start's command first, is appended to `<sweep>/mlflow-server.log`.

A port found free may be taken before the server binds it: a server that exits before it answers is started again
on another port, a few times, before the sweep gives up with the log's path.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from ragen_lit.analysis.sweep_run import child_setup
from ragen_lit.analysis.sweep_store import ARTIFACTS, store_uri
from ragen_lit.errors import RunError

HOST = "127.0.0.1"
LOG_NAME = "mlflow-server.log"
START_TIMEOUT_S = 180.0
"""how long the server may take to answer its first health check (importing MLflow twice on a busy machine)"""
STOP_TIMEOUT_S = 30.0
"""how long the server may take to shut down on SIGTERM before it is killed"""
ATTEMPTS = 3
ENVIRONMENT = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
"""MLflow's job runner (a further process, for GenAI jobs) is not needed to log runs"""


def free_port() -> int:
    """A TCP port of 127.0.0.1 free right now."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def server_command(sweep: Path, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        store_uri(sweep),
        "--default-artifact-root",
        (sweep / ARTIFACTS).as_uri(),
        "--no-serve-artifacts",
        "--host",
        HOST,
        "--port",
        str(port),
        "--workers",
        "1",
    ]


def answers(url: str) -> bool:
    """Whether the server at `url` answers its health check now."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5):
            return True
    except OSError:
        return False


def start(sweep: Path) -> tuple[subprocess.Popen, str]:
    """Start the sweep's server and wait until it answers; (its process, its address). RunError, naming the log,
    when it does not come up."""
    log_path = sweep / LOG_NAME
    with open(log_path, "a") as log:
        for _ in range(ATTEMPTS):
            port = free_port()
            url = f"http://{HOST}:{port}"
            command = server_command(sweep, port)
            log.write(f"$ {' '.join(command)}\n")
            log.flush()
            process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **ENVIRONMENT},
                start_new_session=True,  # Ctrl-C at the terminal reaches the sweep, which stops it in order
                preexec_fn=lambda: child_setup(death_signal=signal.SIGTERM),
            )
            try:
                deadline = time.monotonic() + START_TIMEOUT_S
                while process.poll() is None and time.monotonic() < deadline:
                    if answers(url):
                        return process, url
                    time.sleep(0.2)
            except BaseException:  # Ctrl-C while it starts
                stop(process)
                raise
            if process.poll() is None:
                stop(process)
                raise RunError(
                    f"the sweep's MLflow server did not answer at {url} within {START_TIMEOUT_S:.0f} s; its log: "
                    f"{log_path}"
                )
    raise RunError(f"the sweep's MLflow server exited before it answered, {ATTEMPTS} times; its log: {log_path}")


def stop(process: subprocess.Popen) -> None:
    """Stop the server: SIGTERM (`mlflow server` passes it on to uvicorn and waits for it), then SIGKILL to whatever
    of its session is left."""
    if process.poll() is None:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(STOP_TIMEOUT_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # its session's group: the server's uvicorn, if it outlived it
    process.wait()


@contextlib.contextmanager
def serving(sweep: Path) -> Iterator[str]:
    """The sweep's server for the `with` block; yields its address (`http://127.0.0.1:<port>`)."""
    process, url = start(sweep)
    try:
        yield url
    finally:
        stop(process)
