"""The data files of the file-backed envs (MathQA, Countdown): JSONL, a JSON array or parquet, and which known
record format their fields say they hold.

A format is a name and the fields its records must have (MetaMathQA: `query` and `response`). `pick_format`
takes the one an env's `format` option names, or with `auto` the first whose fields the file has; a file that
fits none is refused in one line naming the option, the file and the fields it has.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ragen_lit.envs.base import OptionError

SUFFIXES = (".jsonl", ".json", ".parquet")


def existing_file(path: str | Path, key: str = "path") -> Path:
    """`path` (user folder expanded) if it is a file with a readable suffix; OptionError naming `key` otherwise."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise OptionError(key, str(file), "an existing .jsonl or .parquet file")
    if not file.name.endswith(SUFFIXES):
        raise OptionError(key, str(file), "a .jsonl or .parquet file (or a .json array)")
    return file


def read_records(file: str, key: str = "path") -> tuple[list[Any], list[str]]:
    """(records, field names) of a JSONL file (one object a line), a JSON array (`[...]`, how MetaMathQA
    ships) or a parquet file. Field names: the parquet columns, or the first JSON record's keys."""
    if file.endswith(".parquet"):
        try:
            import pyarrow.parquet
        except ImportError:
            raise ImportError(f"reading the parquet file {file} needs pyarrow: pip install pyarrow") from None
        table = pyarrow.parquet.read_table(file)
        return table.to_pylist(), list(table.column_names)
    with open(file, encoding="utf-8") as handle:
        text = handle.read()
    if file.endswith(".json") and text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as error:
            raise OptionError(key, file, f"a JSON array or one JSON object per line ({error.msg})") from None
    else:
        records = []
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise OptionError(key, file, f"one JSON object per line (line {number}: {error.msg})") from None
    first = records[0] if records else {}
    return records, sorted(first) if isinstance(first, dict) else []


def describe(formats: Mapping[str, tuple[str, ...]]) -> str:
    """`question + answer (format=qa), query + response (format=metamathqa)`."""
    return ", ".join(f"{' + '.join(fields)} (format={name})" for name, fields in formats.items())


def pick_format(
    formats: Mapping[str, tuple[str, ...]], chosen: str, fields: Iterable[str], file: str, key: str = "path"
) -> str:
    """The format of a file whose records have `fields`: `chosen` (the env's `format` option) when its fields are
    there, with `chosen="auto"` the first of `formats` whose fields are. Refuses, in one line, a bad `chosen`, and
    a file that fits no format (or not the chosen one)."""
    fields = sorted(fields)
    if chosen != "auto" and chosen not in formats:
        raise OptionError("format", chosen, f"one of auto, {', '.join(formats)}")
    candidates = formats if chosen == "auto" else {chosen: formats[chosen]}
    for name, needed in candidates.items():
        if set(needed) <= set(fields):
            return name
    if chosen == "auto":
        raise OptionError(key, file, f"records of a known format, {describe(formats)}; its records have {fields}")
    raise OptionError(
        "format", chosen, f"records with {' + '.join(formats[chosen])}; the records of {file} have {fields}"
    )


def read_known_records(
    file: str, formats: Mapping[str, tuple[str, ...]], chosen: str, item: str, key: str = "path"
) -> tuple[list[Any], str]:
    """(records, format name) of a data file in one of `formats`: read, refused when empty ("a file with at least
    one `item`"), its format picked (`pick_format`) and every record checked for that format's fields."""
    records, fields = read_records(file, key)
    if not records:
        raise OptionError(key, file, f"a file with at least one {item}")
    name = pick_format(formats, chosen, fields, file, key)
    check_fields(records, formats[name], file, key)
    return records, name


def check_fields(records: list[Any], needed: tuple[str, ...], file: str, key: str = "path") -> None:
    """Every record is an object with the `needed` fields (the first one decided the format)."""
    for index, record in enumerate(records):
        if not isinstance(record, dict) or any(field not in record for field in needed):
            found = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise OptionError(key, file, f"records with {' + '.join(needed)} (record {index} has {found})")
