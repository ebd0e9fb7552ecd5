"""The error type every layer raises for a user mistake; `cli` prints its one-line message, no traceback. Also
`error_chain`: the errors behind an error, where a fault's own error is found under a library's rewording of it."""

from __future__ import annotations


class ConfigError(ValueError):
    """A user mistake in the configuration; the message is one line naming key, value and what is allowed."""


class RunError(RuntimeError):
    """A fault of the machine that stops a run (e.g. a checkpoint that cannot be written); the message is one line
    naming the path, the OS error and how to continue. `cli` prints it without a traceback, exit code 1."""


def error_chain(err: BaseException | None) -> list[BaseException]:
    """`err` and the errors behind it (`__cause__`, else `__context__`), outermost first; none for None."""
    if err is None:
        return []
    seen = [err]
    while (inner := seen[-1].__cause__ or seen[-1].__context__) is not None and inner not in seen:
        seen.append(inner)
    return seen
