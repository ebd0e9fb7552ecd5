"""The error type every layer raises for a user mistake; `cli` prints its one-line message, no traceback."""


class ConfigError(ValueError):
    """A user mistake in the configuration; the message is one line naming key, value and what is allowed."""


class RunError(RuntimeError):
    """A fault of the machine that stops a run (e.g. a checkpoint that cannot be written); the message is one line
    naming the path, the OS error and how to continue. `cli` prints it without a traceback, exit code 1."""
