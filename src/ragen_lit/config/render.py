"""A config as a plain dict, as flat dotted keys (for experiment trackers), and as the shipped YAML files: every
field with its docstring as a comment."""

from __future__ import annotations

import dataclasses
import textwrap
from typing import Any

from ragen_lit.config.sections import SECTIONS, Config
from ragen_lit.config.typed_fields import field_docs

# The longest line of a rendered config: the project's line length (ruff's `line-length` in pyproject.toml), so a
# shipped config reads in the same editor width as the code. Only comments are wrapped: a value longer than this
# stays on its line.
WIDTH = 120
# The narrowest a comment beside its value is wrapped to; after a longer value it goes on the lines above the field
MIN_COMMENT_WIDTH = 50


def to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def flat_dict(cfg: Config) -> dict[str, Any]:
    """`{'algo.clip_low': 0.2, 'model.lora.r': 0, …}` for experiment trackers."""
    out = {}

    def add(prefix: str, obj: Any) -> None:
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                add(f"{prefix}.{f.name}", value)
            else:
                out[f"{prefix}.{f.name}"] = value

    for section in SECTIONS:
        add(section, getattr(cfg, section))
    return out


def _wrap(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width` characters, broken at spaces only (a path or a key stays whole)."""
    return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False) or [""]


def _commented(code: str, comment: str, indent: str) -> list[str]:
    """`code  # comment` within `WIDTH` columns: on one line if it fits, else the comment wrapped with its
    continuation lines under its `#`; where a long value leaves the comment fewer than `MIN_COMMENT_WIDTH` columns
    there, the whole comment goes on `# ` lines above the code, at its indent."""
    line = f"{code}  # {comment}"
    if len(line) <= WIDTH:
        return [line]
    column = len(code) + 2
    if WIDTH - column - 2 >= MIN_COMMENT_WIDTH:
        first, *rest = _wrap(comment, WIDTH - column - 2)
        return [f"{code}  # {first}", *(f"{' ' * column}# {text}" for text in rest)]
    return [*(f"{indent}# {text}" for text in _wrap(comment, WIDTH - len(indent) - 2)), code]


def _header_lines(header: str) -> list[str]:
    """The header's lines, a comment line longer than `WIDTH` wrapped into `# ` lines."""
    lines = []
    for line in header.rstrip().splitlines():
        if len(line) > WIDTH and line.startswith("#"):
            lines += [f"# {text}" for text in _wrap(line[1:].strip(), WIDTH - 2)]
        else:
            lines.append(line)
    return lines


def render_yaml(cfg: Config, header: str) -> str:
    """A YAML file showing every field with its docstring as a comment (litgpt-style), comments wrapped at `WIDTH`
    columns (`_commented`)."""
    import yaml

    lines = [*_header_lines(header), ""]

    def add(obj: Any, indent: str) -> None:
        docs = field_docs(type(obj))
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                lines.extend(_commented(f"{indent}{f.name}:", docs[f.name], indent))
                add(value, indent + "  ")
                continue
            text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
            if text.endswith("\n...") or text.endswith("..."):
                text = text.replace("\n...", "").replace("...", "").strip()
            lines.extend(_commented(f"{indent}{f.name}: {text}", docs[f.name], indent))

    for section in SECTIONS:
        lines.append(f"{section}:")
        add(getattr(cfg, section), "  ")
        lines.append("")
    return "\n".join(lines)
