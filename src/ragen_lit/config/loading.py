"""A YAML file and Hydra-style `a.b=c` overrides onto the sections, presets resolved, old and removed keys
handled, every value validated (`load_config`)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from ragen_lit.choices import PRESETS as ALGO_PRESETS
from ragen_lit.config.checks import validate
from ragen_lit.config.overrides import parse_overrides
from ragen_lit.config.sections import MODEL_PRESETS, SECTIONS, Config
from ragen_lit.errors import ConfigError

log = logging.getLogger(__name__)

# old dotted key -> its new name; the old one is still accepted, with one warning
RENAMED_KEYS = {"diagnostics.every_n_steps": "diagnostics.every_n_iterations"}
_ON_THE_FAST_PATH = (
    "the graph cache's fast path does it (rollout.exact=false, the default; rollout.exact=true keeps the exact path)"
)
# dotted key of a removed setting -> why; a config that still has it (a run saved before) loads, with one warning, and
# an override that sets it is refused
RETIRED_KEYS = {
    "model.sdpa_cudnn": "it did not keep a compiled update off cuDNN's kernels and gained nothing on an H200 "
    "(docs/PERFORMANCE.md); optim.pad_to_multiple does what it was for",
    "rollout.hf_pad_prefill": "padding prefills to multiples of 64 positions gained nothing on an H200 "
    "(docs/PERFORMANCE.md)",
    **{
        f"diagnostics.collapse_{name}": "the collapse alarm compares window means of retrieval above chance and "
        "H(Z|X) with the run's first diagnostics (diagnostics.collapse_baseline, collapse_window, "
        "collapse_mi_fraction, collapse_entropy_floor)"
        for name in ("patience", "min_drop", "min_drop_retrieval", "min_relative_drop", "entropy_tolerance")
    },
    **{
        f"rollout.hf_{name}": _ON_THE_FAST_PATH
        for name in ("share_prefixes", "reuse_turns", "decode_attention", "compile_decode", "fuse_projections")
    },
}


# a preset sets the fields it names; the others keep the section's defaults
PRESET_TABLES: dict[str, dict[str, dict[str, Any]]] = {
    "algo": ALGO_PRESETS,
    "model": {name: {} for name in (*MODEL_PRESETS, "hf")},
}


def _parse_overrides(overrides: list[str]) -> list[tuple[str, Any]]:
    pairs = []
    for o in parse_overrides(list(overrides)):
        if o.is_delete() or o.is_add():
            raise ConfigError(
                f"override {o.input_line!r}: '+'/'~' overrides are not supported; every key exists already"
            )
        pairs.append((o.key_or_group, o.value()))
    return pairs


def _set_dotted(tree: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{key}: {p} is not a section")
    node[parts[-1]] = value


def _renamed(keys: list[str], where: str) -> dict[str, str]:
    """{old: new} for the deprecated keys among the dotted `keys`; giving both names of one field is refused."""
    found = {old: new for old, new in RENAMED_KEYS.items() if old in keys}
    for old, new in found.items():
        if new in keys:
            raise ConfigError(
                f"{where}: {old} and {new} are both given; {old} is the old name of {new}, keep only {new}"
            )
    return found


def load_config(path: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """YAML file (optional) + `a.b=c` overrides → validated `Config`.

    Preset sections: `algo=grpo` / `model=smollm2-135m` (as an override, or `algo: grpo` in YAML)
    resets that section to defaults + preset; field overrides apply after."""
    if path is None:
        return _resolve({}, overrides, "")
    return _resolve(_read_yaml(path), overrides, f"--config {path}")


def load_saved_config(run_json: Path, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """The config a run recorded in its run.json (`config`), with `overrides` on top, read as `load_config` reads a
    YAML file (settings removed or renamed since the run was made are handled the same way)."""
    import json

    try:
        tree = json.loads(run_json.read_text())["config"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"{run_json}: does not hold the run's config ({err})") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{run_json}: its config is not a mapping of sections")
    return _resolve(tree, overrides, str(run_json))


def _read_yaml(path: str) -> dict[str, Any]:
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        loaded = OmegaConf.to_container(OmegaConf.load(path))
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"--config {path}: a folder, not a YAML file (e.g. conf/frozenlake.yaml)") from None
    except OSError as err:
        raise ConfigError(f"--config {path}: cannot be read ({err.strerror or err})") from None
    except (OmegaConfBaseException, ValueError) as err:
        raise ConfigError(f"--config {path}: not valid YAML ({str(err).splitlines()[0]})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"--config {path}: not valid YAML ({_yaml_problem(err)})") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"--config {path}: the top level must be a mapping of sections ({', '.join(SECTIONS)})")
    return loaded


def _resolve(tree: dict[str, Any], overrides: list[str] | tuple[str, ...], where: str) -> Config:
    """`tree` (sections read from `where`, empty for none) with `overrides` on top → validated `Config`."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    renamed: dict[str, str] = {}
    if tree:
        for section, value in tree.items():
            if section not in SECTIONS:
                raise ConfigError(f"{where}: unknown section {section!r}; sections are: {', '.join(SECTIONS)}")
            if not isinstance(value, dict) and not (section in PRESET_TABLES and isinstance(value, str)):
                what = "a mapping of its keys or a preset name" if section in PRESET_TABLES else "a mapping of its keys"
                raise ConfigError(f"{where}: section {section} is {value!r}; it must be {what}")
        yaml_keys = [f"{s}.{k}" for s, sect in tree.items() if isinstance(sect, dict) for k in sect]
        for key in set(yaml_keys) & set(RETIRED_KEYS):
            section, name = key.split(".")
            log.warning(f"{where}: {key} is ignored: it was removed, {RETIRED_KEYS[key]}")
            del tree[section][name]
            yaml_keys.remove(key)
        for old, new in _renamed(yaml_keys, where).items():
            section = old.split(".")[0]
            tree[section][new.split(".")[1]] = tree[section].pop(old.split(".")[1])
            renamed[old] = new
    pairs = _parse_overrides(list(overrides))
    cli_renamed = _renamed([key for key, _ in pairs], "overrides")
    renamed.update(cli_renamed)
    for key, value in pairs:
        key = cli_renamed.get(key, key)
        if key in RETIRED_KEYS:
            raise ConfigError(f"{key}={value!r}: this setting was removed, {RETIRED_KEYS[key]}")
        head = key.split(".")[0]
        if head not in SECTIONS:
            raise ConfigError(f"{key}: unknown section {head!r}; sections are: {', '.join(SECTIONS)}")
        if key in PRESET_TABLES:
            if not isinstance(value, str):
                raise ConfigError(f"{key}={value!r}: a preset name is expected")
            tree[key] = {"name": value}
        elif key == head and not isinstance(value, dict):
            keys = ", ".join(f.name for f in dataclasses.fields(getattr(Config(), head)))
            raise ConfigError(f"{key}={value!r}: {key} is a section, not a value or a preset; set its keys ({keys})")
        else:
            _set_dotted(tree, key, value)
    for old, new in renamed.items():
        log.warning(f"{old} is deprecated; it is now {new} (same meaning), please rename it")
    for section, table in PRESET_TABLES.items():
        if isinstance(tree.get(section), str):
            tree[section] = {"name": tree[section]}
        sect = tree.get(section)
        if isinstance(sect, dict) and "name" in sect:
            if sect["name"] not in table:
                raise ConfigError(f"{section}={sect['name']!r} is not a preset; choose one of: {', '.join(table)}")
            tree[section] = {**table[sect["name"]], **sect}
    schema = OmegaConf.structured(Config)
    try:
        merged = OmegaConf.merge(schema, tree)
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        raise ConfigError(_omegaconf_message(err, schema, tree)) from None
    return validate(cfg)


def _yaml_problem(err) -> str:
    """One line from a PyYAML error: what is wrong and where (1-based line and column)."""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    mark = getattr(err, "problem_mark", None)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def _omegaconf_message(err, schema, tree: dict) -> str:
    from omegaconf.errors import ConfigKeyError, ValidationError

    key = getattr(err, "full_key", None) or _failing_key(schema, tree)
    if isinstance(err, ConfigKeyError):
        parent, _, _ = key.rpartition(".")
        node: Any = Config()
        for part in parent.split(".") if parent else ():
            node = getattr(node, part, None)
        allowed = ""
        if parent and dataclasses.is_dataclass(node):
            allowed = f"; keys of {parent} are: " + ", ".join(f.name for f in dataclasses.fields(node))
        return f"{key}: unknown key{allowed}"
    if isinstance(err, ValidationError):
        from omegaconf import ListConfig, OmegaConf

        given = OmegaConf.select(OmegaConf.create(tree), key, default=None)
        scalar = given is not None and not isinstance(given, (list, ListConfig))
        if scalar and isinstance(OmegaConf.select(schema, key), ListConfig):
            return f"{key}={given!r} is not a list; give one in brackets, e.g. {key}=[{given}]"
        return f"{key}: {str(err).splitlines()[0]}"
    return f"{key}: {str(err).splitlines()[0]}"


def _failing_key(schema, tree: dict, prefix: str = "") -> str:
    """The dotted key of `tree` that does not merge onto `schema`, for an error OmegaConf gives without its key (a
    list or a scalar merged onto a section, a mapping onto a value)."""
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    for name, value in tree.items():
        key = f"{prefix}{name}"
        try:
            OmegaConf.merge(schema, _nested(key, value))
        except OmegaConfBaseException:
            section = isinstance(OmegaConf.select(schema, key), DictConfig)
            return _failing_key(schema, value, f"{key}.") if section and isinstance(value, dict) else key
    return prefix.rstrip(".") or "the config"


def _nested(key: str, value: Any) -> dict:
    """`a.b.c`, v -> {a: {b: {c: v}}}."""
    for part in reversed(key.split(".")):
        value = {part: value}
    return value
