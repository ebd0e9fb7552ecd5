"""A config as a plain dict, as flat dotted keys (for experiment trackers), and as the shipped YAML files: every
field with its docstring as a comment."""

from __future__ import annotations

import dataclasses
from typing import Any

from ragen_lit.config.sections import SECTIONS, Config
from ragen_lit.typed_fields import field_docs


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


def render_yaml(cfg: Config, header: str) -> str:
    """A YAML file showing every field with its docstring as a comment (litgpt-style)."""
    import yaml

    lines = [header.rstrip(), ""]

    def add(obj: Any, indent: str) -> None:
        docs = field_docs(type(obj))
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                lines.append(f"{indent}{f.name}:  # {docs[f.name]}")
                add(value, indent + "  ")
                continue
            text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
            if text.endswith("\n...") or text.endswith("..."):
                text = text.replace("\n...", "").replace("...", "").strip()
            lines.append(f"{indent}{f.name}: {text}  # {docs[f.name]}")

    for section in SECTIONS:
        lines.append(f"{section}:")
        add(getattr(cfg, section), "  ")
        lines.append("")
    return "\n".join(lines)
