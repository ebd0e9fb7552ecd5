"""The MLflow servers a sweep started, read from its server log, and whether any of their processes is still there."""

from __future__ import annotations

import time
from pathlib import Path

from ragen_lit.analysis.sweep_server import LOG_NAME, answers


def server_ports(sweep: Path) -> list[int]:
    """The port of every server the sweep started: each start's command line heads its part of the log."""
    lines = (sweep / LOG_NAME).read_text().splitlines()
    return [int(line.split(" --port ")[1].split()[0]) for line in lines if line.startswith("$ ")]


def processes_on(port: int) -> list[str]:
    """The command lines of the processes serving `port`: `mlflow server` and the uvicorn it starts both name it."""
    found = []
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = path.read_bytes().decode(errors="replace").split("\0")
        except OSError:  # the process ended meanwhile
            continue
        if "--port" in words[:-1] and words[words.index("--port") + 1] == str(port) and "mlflow" in " ".join(words):
            found.append(" ".join(words))
    return found


def gone(port: int, within_s: float = 60.0) -> bool:
    """Whether, within `within_s` seconds, no process serves `port` any more and nothing answers there."""
    deadline = time.monotonic() + within_s
    while processes_on(port) or answers(f"http://127.0.0.1:{port}"):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True
