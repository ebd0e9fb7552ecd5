"""Command-line overrides (`key.sub=value`, Hydra's override grammar) read one by one, with errors that say what to
type instead.

Unquoted, the grammar takes a value of ASCII letters, digits, spaces and `_ / \\ - + . : $ % * @ ? |`; anything else
(a non-ASCII letter, `'`, `"`, `=`, `~`, `#`, `!`, `&`, `;`, `<`, `>`, a bracket) needs quotes, as a whole word of the
shell: `'logging.output_dir="/data/été"'` (the outer quotes are the shell's, the inner ones the grammar's). A comma
makes several values, a sweep of runs (what `sweep` takes); `fit` and `config` take one value and say how to quote
a comma. A failing override that is a known key and a value is answered with its quoted form, checked to read back
as the same text.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from ragen_lit.errors import ConfigError

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*")
UNQUOTED = "ASCII letters, digits, spaces and _ / \\ - + . : $ % * @ ? |"


def parse_overrides(words: list[str], sweeps: bool = False) -> list:
    """Hydra's parsed `Override` of each word; `sweeps=False` refuses a sweep (`a=1,2`, `range(...)`, ...).
    Raises ConfigError for a word the grammar refuses, naming the word and its quoted form where that reads back."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    parsed = []
    for word in words:
        try:
            (override,) = parser.parse_overrides([word])
        except HydraException as err:
            raise ConfigError(grammar_error(word, str(err).splitlines()[0])) from None
        if not sweeps and override.is_sweep_override():
            key, _, value = word.partition("=")
            quoted = quoted_override(key, value)
            quote = f"quote a value that holds a comma ({quoted}), or " if quoted else ""
            raise ConfigError(
                f"{word}: a comma (or choice, range, glob) gives several values, a sweep of runs, and this command "
                f"takes one value; {quote}run the grid with `python -m ragen_lit sweep`"
            )
        parsed.append(override)
    return parsed


def grammar_error(word: str, problem: str) -> str:
    """The one line for a word the override grammar refuses (`problem`: the parser's first line)."""
    key, equals, value = word.partition("=")
    if equals and _KEY.fullmatch(key) and value.strip()[:1] not in ("", "[", "{"):
        quoted = quoted_override(key, value)
        if quoted is not None:
            return (
                f"{key}: the value {value!r} needs quotes in an override (unquoted it may hold only {UNQUOTED}); "
                f"pass it as {quoted}"
            )
    return f"{word!r} is not an override ({problem}); overrides look like key.sub=value (e.g. filter.value=0.8)"


def quoted_value(value: str) -> str:
    """`value` quoted for the grammar: in double quotes, or single quotes where it holds a double quote (the grammar
    cannot read back a value that ends in a backslash: `quoted_override` checks)."""
    if '"' not in value:
        return f'"{value}"'
    if "'" not in value:
        return f"'{value}'"
    return '"' + value.replace('"', '\\"') + '"'


def quoted_override(key: str, value: str) -> str | None:
    """`key=value` as one shell word whose value the grammar reads back as the text `value`; None where no quoting
    does (e.g. a value that ends in a backslash)."""
    word = _shell_word(f"{key}={quoted_value(value)}")
    return word if _reads_back(shlex.split(word)[0], value) else None


def _shell_word(text: str) -> str:
    """`text` as one word of a POSIX shell: in single quotes, or in double quotes where it holds a single quote."""
    if "'" not in text:
        return f"'{text}'"
    if "$" in text or "`" in text:  # a shell expands these in double quotes; single quotes joined by "'" do not
        return shlex.quote(text)
    return '"' + re.sub(r'([\\"])', r"\\\1", text) + '"'


def _reads_back(word: str, value: str) -> bool:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        (override,) = OverridesParser.create().parse_overrides([word])
    except HydraException:
        return False
    parsed: Any = override.value()
    return parsed == value and not override.is_sweep_override()
