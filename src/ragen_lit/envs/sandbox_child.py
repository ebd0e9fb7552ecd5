"""The child side of the coding sandbox: this file's text is run as `python -I -S -B -c <text>` by
`ragen_lit.envs.sandbox`, never imported by the trainer.

Order matters: read the job file (then delete it), lower every resource limit (soft = hard, so the
program cannot raise them back unless it runs as root), import what the harness needs, install the audit
hook, and only then compile and run the untrusted program. Results go out as one JSON line per test on a
copy of the original stdout; the expected outputs never enter this process, so a program that finds the
channel can only report outputs it could have printed anyway.
"""

import builtins
import io
import json
import os
import resource
import signal
import sys
import time

JOB_FILE = ".job.json"


def _lower_limits(limits):
    cpu = int(limits["cpu_seconds"])
    settings = [
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (limits["memory_bytes"], limits["memory_bytes"])),
        (resource.RLIMIT_FSIZE, (limits["file_bytes"], limits["file_bytes"])),
        (resource.RLIMIT_NOFILE, (limits["open_files"], limits["open_files"])),
        (resource.RLIMIT_NPROC, (limits["processes"], limits["processes"])),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    for which, (soft, hard) in settings:
        current_soft, current_hard = resource.getrlimit(which)
        if current_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, current_hard), min(hard, current_hard)
        resource.setrlimit(which, (soft, hard))


# Events refused outright (prefix match): processes, signals to others, sockets, native code, limits,
# more audit hooks, and the object walks that could reach the hook itself.
_REFUSED = (
    "socket.",
    "subprocess.",
    "os.system",
    "os.exec",
    "os.spawn",
    "os.posix_spawn",
    "os.fork",
    "os.forkpty",
    "os.kill",
    "os.killpg",
    "os.setuid",
    "os.setgid",
    "os.chroot",
    "signal.pthread_kill",
    "pty.spawn",
    "ctypes.",
    "resource.setrlimit",
    "resource.prlimit",
    "sys.addaudithook",
    "sys.setprofile",
    "sys.settrace",
    "gc.get_objects",
    "gc.get_referrers",
    "gc.get_referents",
    "os.symlink",
    "os.link",
    "webbrowser.open",
    "urllib.Request",
    "mmap.__new__",
)
_REFUSED_MODULES = frozenset(
    {"ctypes", "_ctypes", "_posixsubprocess", "subprocess", "multiprocessing", "_multiprocessing", "socket", "_socket"}
    | {"ssl", "_ssl", "pty", "select", "selectors", "_signal_ext", "fcntl", "termios", "mmap", "_xxsubinterpreters"}
)
# Events whose path arguments must stay inside the work folder (any access) or the stdlib (reading only).
_PATH_EVENTS = frozenset(
    {"os.listdir", "os.scandir", "os.chdir", "os.mkdir", "os.remove", "os.rmdir", "os.rename", "os.truncate"}
    | {"os.chmod", "os.chown", "os.utime", "glob.glob", "shutil.copyfile", "shutil.copymode", "shutil.copystat"}
    | {"shutil.copytree", "shutil.move", "shutil.rmtree", "shutil.chown", "os.removexattr", "os.setxattr"}
    | {"os.listxattr", "os.getxattr"}
)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _install_audit_hook(workdir, read_roots):
    # The hook keeps its settings in default arguments (immutable values; replacing `__defaults__` or
    # `__code__` is itself an audited event it refuses) and no name outside refers to it.
    def hook(
        event,
        args,
        refused=_REFUSED,
        modules=_REFUSED_MODULES,
        path_events=_PATH_EVENTS,
        workdir=workdir,
        read_roots=read_roots,
        realpath=os.path.realpath,
        fsdecode=os.fsdecode,
        write_flags=_WRITE_FLAGS,
    ):
        if event.startswith(refused):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "import":
            if args[0] in modules or str(args[0]).split(".")[0] in modules:
                raise PermissionError(f"sandbox: importing {args[0]} is not allowed")
            return
        if (
            event == "object.__setattr__"
            and len(args) > 1
            and args[1] in ("__code__", "__defaults__", "__kwdefaults__")
        ):
            raise PermissionError("sandbox: replacing a function's code or defaults is not allowed")
        if event == "open":
            path = args[0]
            if isinstance(path, int):
                return
            mode, flags = args[1] if len(args) > 1 else None, args[2] if len(args) > 2 else 0
            writing = any(c in str(mode) for c in "wax+") if mode is not None else bool((flags or 0) & write_flags)
            paths = [path]
        elif event in path_events:
            writing = event not in ("os.listdir", "os.scandir", "glob.glob", "os.listxattr", "os.getxattr")
            paths = [a for a in args if isinstance(a, (str, bytes, os.PathLike))][:2]
            if event in ("os.listdir", "os.scandir") and (not args or args[0] is None):
                paths = ["."]
        else:
            return
        for path in paths:
            if isinstance(path, int):
                continue
            full = realpath(fsdecode(path))
            if full == workdir or full.startswith(workdir + "/"):
                continue
            if not writing and any(full == root or full.startswith(root + "/") for root in read_roots):
                continue
            raise PermissionError(f"sandbox: {event} outside the work folder is not allowed: {fsdecode(path)!r}")

    sys.addaudithook(hook)


class _CappedBytes(io.RawIOBase):
    """A write-only byte sink that refuses to grow beyond `cap` bytes."""

    def __init__(self, cap):
        self.cap, self.chunks, self.size = cap, [], 0

    def writable(self):
        return True

    def write(self, data):
        if self.size + len(data) > self.cap:
            raise OSError("output limit exceeded")
        self.chunks.append(bytes(data))
        self.size += len(data)
        return len(data)

    def getvalue(self):
        return b"".join(self.chunks)


class _TestTimeout(BaseException):
    pass


def _on_alarm(signum, frame):
    raise _TestTimeout


def _jsonable(value, depth=0):
    """The JSON form of a returned value (tuples and sets become lists); anything else becomes its repr."""
    if depth > 50:
        return repr(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [_jsonable(v, depth + 1) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return items
    if isinstance(value, dict):
        return {str(k): _jsonable(v, depth + 1) for k, v in value.items()}
    return repr(value)


def _error_text(error):
    return f"{type(error).__name__}: {error}"[:300]


def main():
    workdir = os.getcwd()
    with open(JOB_FILE, encoding="utf-8") as handle:
        job = json.load(handle)
    os.unlink(JOB_FILE)
    limits = job["limits"]
    _lower_limits(limits)
    results = os.fdopen(os.dup(1), "w", encoding="utf-8")
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    read_roots = tuple(os.path.realpath(p) for p in sys.path if p)
    signal.signal(signal.SIGALRM, _on_alarm)
    # `exit`/`quit` come from `site`, which -S skips; programs call them anyway.
    builtins.exit = builtins.quit = sys.exit
    sys.setrecursionlimit(10_000)
    deadline = time.monotonic() + limits["wall_seconds"]
    per_test = limits["test_seconds"]
    output_cap = limits["output_bytes"]
    _install_audit_hook(workdir, read_roots)

    def report(index, status, output=None, error=None):
        results.write(json.dumps({"i": index, "status": status, "output": output, "error": error}) + "\n")
        results.flush()

    try:
        code = compile(job["source"], "<solution>", "exec")
    except (SyntaxError, ValueError) as error:
        for index in range(len(job["inputs"])):
            report(index, "error", error=_error_text(error))
        return
    entry = None
    if job["fn_name"]:
        namespace = {"__name__": "__solution__", "__builtins__": builtins}
        try:
            signal.setitimer(signal.ITIMER_REAL, max(0.01, min(per_test, deadline - time.monotonic())))
            exec(code, namespace)
            signal.setitimer(signal.ITIMER_REAL, 0)
            solution_class = namespace.get("Solution")
            if isinstance(solution_class, type) and hasattr(solution_class, job["fn_name"]):
                entry = ("method", solution_class)
            elif callable(namespace.get(job["fn_name"])):
                entry = ("function", namespace[job["fn_name"]])
            else:
                raise NameError(f"the program defines no function {job['fn_name']!r}")
        except BaseException as error:  # noqa: BLE001 - the program's own failure, reported per test
            signal.setitimer(signal.ITIMER_REAL, 0)
            message = "time limit exceeded" if isinstance(error, _TestTimeout) else _error_text(error)
            for index in range(len(job["inputs"])):
                report(index, "error", error=message)
            return
    for index, test_input in enumerate(job["inputs"]):
        left = deadline - time.monotonic()
        if left <= 0:
            report(index, "timeout", error="time limit exceeded")
            continue
        sink = _CappedBytes(output_cap)
        stdout = io.TextIOWrapper(io.BufferedWriter(sink), encoding="utf-8", write_through=True)
        status, output, error = "ok", None, None
        try:
            signal.setitimer(signal.ITIMER_REAL, max(0.01, min(per_test, left)))
            if entry is None:
                sys.stdin = io.TextIOWrapper(io.BytesIO(str(test_input).encode("utf-8")), encoding="utf-8")
                sys.stdout = stdout
                try:
                    exec(code, {"__name__": "__main__", "__builtins__": builtins})
                except SystemExit:
                    pass
            else:
                kind, target = entry
                function = getattr(target(), job["fn_name"]) if kind == "method" else target
                output = _jsonable(function(*test_input))
        except _TestTimeout:
            status, error = "timeout", "time limit exceeded"
        except BaseException as caught:  # noqa: BLE001 - the program's own failure
            status, error = "error", _error_text(caught)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            sys.stdout, sys.stdin = sys.__stdout__, sys.__stdin__
        if entry is None:
            try:
                stdout.flush()
            except BaseException:  # noqa: BLE001
                status, error = "error", "output limit exceeded"
            output = sink.getvalue().decode("utf-8", "replace")
        elif len(json.dumps(output)) > output_cap:
            status, output, error = "error", None, "output limit exceeded"
        report(index, status, output, error)


main()
