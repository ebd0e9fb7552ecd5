"""Dataclass fields that carry their own documentation and checks, shared by the training config and the
`diagnose`, `warm-start` and `evaluate` options: a field's doc is the string literal right under it (an attribute
docstring, as in litgpt), its checks sit in its `checked(...)` default, `check_fields` applies them with one-line
errors, `flag` names a field on the command line and `add_option_flags` makes an options class's flags.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import math
import textwrap
import typing
from collections.abc import Callable
from dataclasses import field
from typing import Any

from ragen_lit.errors import ConfigError


def checked(default: Any, **rules: Any) -> Any:
    """A field default with the checks `check_fields` applies: `choices=(...)`, bounds `ge`/`gt`/`le`/`lt`,
    `auto_or_ge=n` (0 means auto, any other value must be >= n) and, for a list, `items=(...)` (each item one of
    these, none twice). A list default is copied for every instance."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=rules)
    return field(default=default, metadata=rules)


_BOUNDS = (
    ("ge", ">=", lambda v, b: v >= b),
    ("gt", ">", lambda v, b: v > b),
    ("le", "<=", lambda v, b: v <= b),
    ("lt", "<", lambda v, b: v < b),
)


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """{field name: its docstring, whitespace collapsed to one line} of a dataclass, read from its source."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def flag(name: str) -> str:
    """The command-line flag of an options dataclass's field (`max_rows` -> `--max-rows`)."""
    return "--" + name.replace("_", "-")


def add_option_flags(parser: argparse.ArgumentParser, options: type) -> None:
    """One `--flag` per field of the dataclass `options`: its default, docstring and choices; no default = required."""
    docs, types = field_docs(options), typing.get_type_hints(options)
    for f in dataclasses.fields(options):
        help_text = docs[f.name].replace("%", "%%")  # argparse %-formats help texts
        kwargs: dict = {"help": help_text, "choices": f.metadata.get("choices")}
        if f.default is dataclasses.MISSING:
            kwargs["required"] = True
        else:
            kwargs["default"] = f.default
        if int in (types[f.name], *typing.get_args(types[f.name])):
            kwargs["type"] = int
        elif float in (types[f.name], *typing.get_args(types[f.name])):
            kwargs["type"] = float
        parser.add_argument(flag(f.name), **kwargs)


def check_fields(obj: Any, key_of: Callable[[str], str]) -> None:
    """Apply every field's `checked` rules to the dataclass `obj`; `key_of(field name)` is how an error names
    the field (`filter.value`, `--max-rows`); a field holding a dataclass is checked the same way (`model.lora.r`).
    Raises ConfigError."""
    for f in dataclasses.fields(obj):
        value, rules, key = getattr(obj, f.name), f.metadata, key_of(f.name)
        if value is None:
            continue
        if dataclasses.is_dataclass(value):
            check_fields(value, lambda name, key=key: f"{key}.{name}")
            continue
        if "choices" in rules and value not in rules["choices"]:
            raise ConfigError(f"{key}={value!r} is not allowed; choose one of: {', '.join(map(str, rules['choices']))}")
        if "items" in rules:
            _check_items(value, rules["items"], key)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{key}={value!r} must be a finite number")
        for name, sign, ok in _BOUNDS:
            if name in rules and not ok(value, rules[name]):
                raise ConfigError(f"{key}={value!r} is out of range; it must be {sign} {rules[name]}")
        if "auto_or_ge" in rules and 0 < value < rules["auto_or_ge"]:
            raise ConfigError(f"{key}={value} must be 0 (auto) or >= {rules['auto_or_ge']}")


def _check_items(value: list, allowed: tuple, key: str) -> None:
    """Each item of the list `value` is one of `allowed`, and none comes twice."""
    for i, item in enumerate(value):
        if item not in allowed:
            raise ConfigError(f"{key}={value!r}: {item!r} is not allowed; choose from: {', '.join(map(str, allowed))}")
        if item in value[:i]:
            raise ConfigError(f"{key}={value!r} names {item} twice; list each once")
