"""Run untrusted Python programs against tests: the sandbox of the `coding` environment.

`run_program(source, inputs, fn_name, limits)` runs one program on every test input in a fresh process
and returns what each test produced (`ProgramRun`); the caller compares outputs with the expected ones,
which never enter the sandbox. `run_programs` runs many at once from a thread pool (each run spends its
time waiting on a child process, so the threads do not contend for the GIL).

What holds, layer by layer (measured by tests/envs/test_sandbox.py on this project's CI machine):

* **A separate process** started without the parent's environment (`env={}`), as isolated Python
  (`-I -S -B`: no site-packages, no user paths, no `PYTHON*` variables), with stdin from /dev/null, its
  working folder a fresh temporary one that is deleted afterwards, all other file descriptors closed.
* **Resource limits** (`setrlimit`, soft = hard, set by the child before the program is compiled):
  CPU seconds (SIGKILL one second past the soft limit), address space, bytes per written file, open files,
  processes, no core dumps. A normal user cannot raise a hard limit again. Wall time is the parent's: it
  kills the child's whole process group at `wall_seconds + 0.5 s`; each test also has its own timer.
  Everything read back is capped at `output_bytes` per test (the child refuses to print more) and per
  stream (the parent stops reading and kills the child).
* **Namespaces, where `unshare` works** (util-linux; as root, or as a user where unprivileged user
  namespaces are enabled): a new network namespace (no interface but a downed loopback: no network even
  for a program that gets past the audit hook) and a new PID namespace whose first process is the
  harness: when it dies, the kernel kills every process left in the namespace, so nothing outlives a run,
  and the trainer's PID is not visible from inside.
* **An audit hook** (PEP 578) installed in the child before the program runs refuses: sockets, processes
  (`os.system`, `subprocess`, `os.fork`/`exec*`/`spawn*`/`posix_spawn`), signals to other processes
  (`os.kill`, `os.killpg`), `ctypes`, `mmap`, changing resource limits, adding audit hooks, tracing, walking
  the garbage collector's objects, links, and any file or folder access outside the work folder (reading
  the interpreter's standard library is allowed). A refused call raises `PermissionError` in the program.
* **Dropping to `nobody`** when the trainer runs as root and the interpreter is readable by others: then
  the rlimits bind (root may raise them), RLIMIT_NPROC counts, and the kernel's file permissions apply.

What does not hold, and what then still bounds a program:

* Audit hooks are not a security boundary (PEP 578 says so): a program that finds a path the hook does
  not see (a C extension of the standard library that opens files or calls the OS without an audit event)
  can read world-readable files, such as this project's source and data, and, without the namespaces,
  open sockets. The rlimits, the wall-time kill and the namespaces still hold for it.
* As root without the drop to `nobody` (for instance when the interpreter lives under /root, as on this
  project's CI machine): RLIMIT_NPROC does not bind root and a program that escaped the hook could raise
  its own limits and write anywhere root may. Forks are then stopped only by the hook, and the PID
  namespace (or, without it, the process-group kill) ends whatever was started when the run ends.
* Without `unshare`: no network isolation beyond the hook, and a process that escaped the hook and left
  the process group (`setsid`) can outlive the run.
* Running the trainer as a normal user with unprivileged user namespaces is the strongest setting: every
  layer above holds, and the kernel enforces the limits.
"""

from __future__ import annotations

import functools
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CHILD_SOURCE = (Path(__file__).with_name("sandbox_child.py")).read_text(encoding="utf-8")
NOBODY = 65534
KILL_GRACE_SECONDS = 0.5


@dataclass(frozen=True)
class SandboxLimits:
    """What one program run may use (all its tests together, except `test_seconds`)."""

    wall_seconds: float = 4.0  # the whole run, from start to the last test; the parent kills at +0.5 s
    test_seconds: float = 1.0  # one test (a timer inside the child; a test over it is a timeout)
    cpu_seconds: int = 4  # RLIMIT_CPU; the kernel kills the child one second later
    memory_bytes: int = 512 * 2**20  # RLIMIT_AS (address space)
    output_bytes: int = 64 * 2**10  # printed (or returned) per test, and per stream read back
    file_bytes: int = 2**20  # RLIMIT_FSIZE: largest file the program may write (in its work folder)
    open_files: int = 32  # RLIMIT_NOFILE
    processes: int = 0  # RLIMIT_NPROC (binds a non-root uid only): 0 = no new processes or threads

    def __post_init__(self) -> None:
        for name in ("wall_seconds", "test_seconds", "cpu_seconds", "memory_bytes", "output_bytes", "file_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0, got {getattr(self, name)!r}")
        if self.open_files < 8 or self.processes < 0:
            raise ValueError("SandboxLimits.open_files must be >= 8 and processes >= 0")


@dataclass
class TestRun:
    """What one test produced: `status` is ok (ran to the end), error (raised; `error` says what),
    timeout, or missing (the run ended before reaching it)."""

    status: str
    output: Any = None  # stdout text (stdio tests) or the returned value as JSON (function tests)
    error: str | None = None


@dataclass
class ProgramRun:
    tests: list[TestRun]
    killed: bool = False  # the parent killed the run (wall time or too much output)
    exit_code: int | None = None
    stderr: str = ""  # the child's own stderr (a crash of the interpreter), capped
    seconds: float = 0.0
    isolation: list[str] = field(default_factory=list)  # the layers this run had (see the module docstring)


@functools.lru_cache(maxsize=1)
def interpreter() -> str:
    """The base interpreter (not a virtual environment's wrapper: -I -S never sees site-packages anyway)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _readable_by_others(path: str) -> bool:
    """Whether uid `nobody` can reach `path`: every folder above it searchable by others."""
    parts = Path(path).resolve().parents
    return all(os.stat(p).st_mode & 0o001 for p in parts) and bool(os.stat(path).st_mode & 0o005)


@functools.lru_cache(maxsize=1)
def drop_to_nobody() -> bool:
    """Run children as `nobody` (only possible, and only needed, when the trainer is root)."""
    if os.geteuid() != 0:
        return False
    stdlib = os.path.dirname(json.__file__).rsplit("/json", 1)[0]
    return _readable_by_others(interpreter()) and _readable_by_others(stdlib)


@functools.lru_cache(maxsize=1)
def namespace_prefix() -> tuple[str, ...]:
    """The `unshare` command line that gives a child its own network and PID namespaces, or () where
    this machine does not allow it (checked once by running `true` under it)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    prefix = [unshare, "--net", "--pid", "--fork", "--kill-child"]
    if os.geteuid() != 0:
        prefix[1:1] = ["--user", "--map-current-user"]
    elif drop_to_nobody():
        prefix += ["--setgid", str(NOBODY), "--setuid", str(NOBODY)]
    try:
        probe = subprocess.run([*prefix, "true"], env={}, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(prefix) if probe.returncode == 0 else ()


def isolation_layers() -> list[str]:
    layers = ["process", "rlimits", "audit-hook"]
    if namespace_prefix():
        layers += ["net-namespace", "pid-namespace"]
    if drop_to_nobody() and namespace_prefix():
        layers.append("nobody")
    return layers


def run_program(
    source: str, inputs: Sequence[Any], fn_name: str | None = None, limits: SandboxLimits | None = None
) -> ProgramRun:
    """Run `source` once on every test input.

    With `fn_name`, the program defines that function (or a class `Solution` with that method) and each
    input is the list of its arguments; without, the program reads the input from stdin and prints.
    Never raises for anything the program does."""
    limits = limits or SandboxLimits()
    started = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="ragen-sandbox-")
    try:
        os.chmod(workdir, 0o700)
        prefix = namespace_prefix()
        if prefix and drop_to_nobody():
            os.chown(workdir, NOBODY, NOBODY)
        job = {"source": source, "fn_name": fn_name, "inputs": list(inputs), "limits": asdict(limits)}
        job_file = os.path.join(workdir, ".job.json")
        with open(job_file, "w", encoding="utf-8") as handle:
            json.dump(job, handle)
        if prefix and drop_to_nobody():
            os.chown(job_file, NOBODY, NOBODY)
        command = [*prefix, interpreter(), "-I", "-S", "-B", "-X", "utf8", "-c", CHILD_SOURCE]
        run = _execute(command, workdir, len(inputs), limits)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    run.seconds = time.monotonic() - started
    run.isolation = isolation_layers()
    return run


def _execute(command: list[str], workdir: str, num_tests: int, limits: SandboxLimits) -> ProgramRun:
    try:
        child = subprocess.Popen(
            command,
            cwd=workdir,
            env={},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            close_fds=True,
            start_new_session=True,
        )
    except OSError as error:
        return ProgramRun([TestRun("missing", error=f"sandbox failed to start: {error}")] * num_tests)
    # stdout carries JSON lines of at most output_bytes of payload each, escaped (up to 6 bytes a byte)
    caps = {child.stdout: num_tests * (6 * limits.output_bytes + 512) + 4096, child.stderr: limits.output_bytes}
    buffers: dict[Any, bytearray] = {child.stdout: bytearray(), child.stderr: bytearray()}
    deadline = time.monotonic() + limits.wall_seconds + KILL_GRACE_SECONDS
    killed = False
    with selectors.DefaultSelector() as selector:
        for stream in buffers:
            selector.register(stream, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                killed = True
                break
            for key, _ in selector.select(timeout=left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                buffers[key.fileobj] += chunk
                if len(buffers[key.fileobj]) > caps[key.fileobj]:
                    killed = True
            if killed:
                break
    _kill_group(child)
    exit_code = child.wait()
    child.stdout.close()
    child.stderr.close()
    tests = [TestRun("missing", error="the program was stopped before this test") for _ in range(num_tests)]
    for line in bytes(buffers[child.stdout]).decode("utf-8", "replace").splitlines():
        try:
            record = json.loads(line)
            index = int(record["i"])
        except (ValueError, KeyError, TypeError):
            continue
        if 0 <= index < num_tests and tests[index].status == "missing":
            tests[index] = TestRun(str(record.get("status")), record.get("output"), record.get("error"))
    stderr = bytes(buffers[child.stderr][: limits.output_bytes]).decode("utf-8", "replace")
    if killed:
        reason = "time limit exceeded" if time.monotonic() >= deadline else "output limit exceeded"
        for test in tests:
            if test.status == "missing":
                test.status, test.error = "timeout" if reason.startswith("time") else "error", reason
    elif exit_code != 0:
        reason = _exit_reason(exit_code)
        for test in tests:
            if test.status == "missing":
                test.error = reason
    return ProgramRun(tests, killed=killed, exit_code=exit_code, stderr=stderr)


def _exit_reason(exit_code: int) -> str:
    if exit_code < 0:
        name = signal.Signals(-exit_code).name if -exit_code in signal.valid_signals() else str(-exit_code)
        return {"SIGKILL": "killed (CPU or memory limit)", "SIGXCPU": "CPU time limit exceeded"}.get(
            name, f"crashed ({name})"
        )
    return f"the program exited with code {exit_code}"


def _kill_group(child: subprocess.Popen) -> None:
    """SIGKILL the child's whole process group (its session leader is the child itself)."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        child.kill()
    except ProcessLookupError:
        pass


def run_programs(
    jobs: Sequence[tuple[str, Sequence[Any], str | None]],
    limits: SandboxLimits | None = None,
    max_workers: int = 16,
) -> list[ProgramRun]:
    """`run_program` for every `(source, inputs, fn_name)` job, `max_workers` at a time; results in order."""
    if not jobs:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(jobs))), thread_name_prefix="sandbox") as pool:
        return list(pool.map(lambda job: run_program(job[0], job[1], job[2], limits), jobs))
