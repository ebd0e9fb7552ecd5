"""The machine and date lines of the benchmarks' tables (standard library only: the CPU benchmarks of the
environments import no torch)."""

from __future__ import annotations

import datetime
import platform


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo where there is one, else what `platform` knows."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def utc_now() -> str:
    """The date line of a result: UTC, to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
