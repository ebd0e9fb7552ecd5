"""The coding sandbox against what a policy will eventually write: every attack ends within twice the
wall limit, fails its tests, leaves the trainer and its files alone, and leaves no process running."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from ragen_lit.envs.coding import default_data_path
from ragen_lit.envs.sandbox import SandboxLimits, isolation_layers, namespace_prefix, run_program, run_programs

LIMITS = SandboxLimits(wall_seconds=2.0, test_seconds=1.0, cpu_seconds=2, memory_bytes=256 * 2**20)
MARKER = b"child side of the coding sandbox"  # in every sandbox process's command line


def sandbox_processes() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if MARKER in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def run_attack(source: str, fn_name: str | None = None, inputs=("",)):
    started = time.monotonic()
    run = run_program(source, list(inputs) if fn_name is None else [[]], fn_name, LIMITS)
    elapsed = time.monotonic() - started
    assert elapsed < 2 * LIMITS.wall_seconds, (elapsed, run)
    deadline = time.monotonic() + 1.0
    while sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox_processes() == [], "a sandbox process outlived its run"
    return run


def failed(run, fragment: str = "") -> bool:
    return all(t.status != "ok" and fragment in (t.error or "") for t in run.tests)


def test_a_correct_program_runs_its_tests():
    run = run_program("a, b = map(int, input().split())\nprint(a + b)", ["1 2\n", "30 4\n"], None, LIMITS)
    assert [(t.status, t.output) for t in run.tests] == [("ok", "3\n"), ("ok", "34\n")]
    run = run_program("class Solution:\n    def f(self, x):\n        return (x, {x})", [[1], [2]], "f", LIMITS)
    assert [t.output for t in run.tests] == [[1, [1]], [2, [2]]]


@pytest.mark.parametrize(
    "source, fragment",
    [
        ("while True:\n    pass", "time limit"),
        # swallows the per-test timer: the parent's wall-time kill ends it
        (
            "while True:\n    try:\n        while True:\n            pass\n    except BaseException:\n        pass",
            "time",
        ),
        (
            "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "signal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass",
            "",
        ),
        ("import os\nwhile True:\n    os.fork()", "os.fork is not allowed"),
        ("import os\nos.system('sleep 30 &')", "os.system is not allowed"),
        ("import subprocess\nsubprocess.Popen(['sleep', '30'])", "not allowed"),
        ("import os\nos.posix_spawn('/bin/sleep', ['sleep', '30'], {})", "not allowed"),
        ("import os\nos.execv('/bin/sh', ['sh'])", "not allowed"),
        ("chunks = []\nwhile True:\n    chunks.append(' ' * 10**7)", "MemoryError"),
        ("x = ' ' * 10**10", "MemoryError"),
        ("while True:\n    print('x' * 1000)", "output limit"),
        ("import os\nos.kill(os.getppid(), 9)", "os.kill is not allowed"),
        ("import os\nos.killpg(0, 9)", "not allowed"),
        ("import signal, threading\nsignal.pthread_kill(threading.main_thread().ident, 9)", "not allowed"),
        ("import sys\nsys.setrecursionlimit(10**8)\ndef f(n):\n    return f(n + 1)\nf(0)", ""),
        ("def f(n):\n    return f(n + 1)\nf(0)", "RecursionError"),
        ("import socket", "importing socket is not allowed"),
        ("import _socket", "not allowed"),
        ("import ctypes", "not allowed"),
        ("import gc\ngc.get_objects()", "not allowed"),
        ("import os, sys\nsys.addaudithook(lambda *a: None)\nos.system('true')", "os.system is not allowed"),
        ("print(open('/etc/passwd').read())", "outside the work folder"),
        ("import os\nprint(os.listdir('/etc'))", "outside the work folder"),
        ("import os\nprint(os.listdir(os.path.expanduser('~')))", "outside the work folder"),
        ("print(open('/root/.bashrc').read())", "outside the work folder"),
        (f"print(open({str(default_data_path())!r}).read())", "outside the work folder"),
        ("import os\nos.symlink('/etc/passwd', 'p')\nprint(open('p').read())", "not allowed"),
        ("import os\nos.chdir('/')\nprint(open('etc/passwd').read())", "outside the work folder"),
    ],
)
def test_attacks_end_in_time_and_fail(source, fragment):
    assert failed(run_attack(source), fragment)


def test_exits_end_the_test_not_the_run():
    run = run_program("import sys\nprint(input())\nsys.exit(3)", ["a\n", "b\n"], None, LIMITS)
    assert [(t.status, t.output) for t in run.tests] == [("ok", "a\n"), ("ok", "b\n")]
    run = run_attack("import os\nos._exit(0)", inputs=["", ""])
    assert failed(run)


def test_writing_stays_in_the_work_folder(tmp_path):
    target = tmp_path / "escaped.txt"
    run = run_attack(f"open({str(target)!r}, 'w').write('x')")
    assert failed(run, "outside the work folder") and not target.exists()
    run = run_program("open('scratch.txt', 'w').write('ok')\nprint(open('scratch.txt').read())", [""], None, LIMITS)
    assert run.tests[0].output == "ok\n"
    big = run_attack("open('big', 'w').write('x' * (2 * 2**20))")
    assert failed(big)


def test_stderr_flood_is_cut_and_killed():
    run = run_attack("import sys\nwhile True:\n    sys.stderr.write('x' * 10000)")
    assert run.killed and failed(run) and len(run.stderr) <= LIMITS.output_bytes


def test_the_program_sees_no_environment_and_a_fresh_folder():
    os.environ["RAGEN_SECRET_FOR_TEST"] = "s3cret"
    try:
        run = run_program("import os\ndef f():\n    return [dict(os.environ), os.listdir('.')]", [[]], "f", LIMITS)
    finally:
        del os.environ["RAGEN_SECRET_FOR_TEST"]
    environment, listing = run.tests[0].output
    assert set(environment) <= {"LC_CTYPE"} and listing == []  # Python's own UTF-8 locale coercion (PEP 538)


def test_no_network_even_past_the_hook():
    """With namespaces, the child's network namespace has only a downed loopback."""
    if not namespace_prefix():
        pytest.skip("unshare is not available here: the audit hook alone refuses sockets")
    assert "net-namespace" in isolation_layers() and "pid-namespace" in isolation_layers()
    run = run_program("def f():\n    return open('/proc/net/dev').read()", [[]], "f", LIMITS)
    assert run.tests[0].status == "error"  # /proc is outside the work folder too


def test_many_programs_run_in_parallel():
    n = 8
    limits = SandboxLimits(wall_seconds=4.0, test_seconds=3.0)
    started = time.monotonic()
    runs = run_programs([("import time\ntime.sleep(1)\nprint('done')", [""], None)] * n, limits, max_workers=n)
    elapsed = time.monotonic() - started
    assert all(r.tests[0].output == "done\n" for r in runs)
    assert elapsed < n / 2, elapsed
