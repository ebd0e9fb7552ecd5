"""The error type every layer raises for a user mistake; `cli` prints its one-line message, no traceback."""


class ConfigError(ValueError):
    """A user mistake in the configuration; the message is one line naming key, value and what is allowed."""
