"""Bounds a config must keep beyond each field's own range, for what no single field states: a size no machine can
hold, or a place outside the output folder, is refused before any work, in one line naming the key and what is
allowed.

`check_config` needs no machine (`config.validate` calls it, so `config`, `sweep` and `fit` refuse alike): a turn's
answer inside the context, and run folders inside `logging.output_dir`. `check_observations` needs one built env:
its longest observation (its observation space's `max_length`, set by options such as a map's size) must fit in
the context at `CHARS_PER_TOKEN`. The bounds of this machine and of the model are `machine_bounds`'.
"""

from __future__ import annotations

from ragen_lit.errors import ConfigError

CHARS_PER_TOKEN = 16
"""the most characters a token of the context is taken to cover on average (English text averages about 4, the
tiny model's tokenizer on env text less): an observation longer than the context times this cannot fit in it"""


def check_config(cfg) -> None:
    """The bounds that need no machine; raises ConfigError."""
    r = cfg.rollout
    if r.max_new_tokens >= r.max_context_tokens:
        raise ConfigError(
            f"rollout.max_new_tokens={r.max_new_tokens} must be below rollout.max_context_tokens="
            f"{r.max_context_tokens}: a turn's answer and the conversation before it share the context"
        )
    output_dir = cfg.logging.output_dir
    if not output_dir.strip():
        raise ConfigError(
            f"logging.output_dir={output_dir!r} is empty; name the folder runs are written under (default: runs)"
        )
    name = cfg.logging.run_name
    if name is not None and (name.strip() in (".", "..") or any(c in name for c in "/\\\0")):
        raise ConfigError(
            f"logging.run_name={name!r} must be a plain name (no '/' or '\\', not '.' or '..'): it names the run's "
            "folder inside logging.output_dir"
        )


def check_observations(cfg, env) -> None:
    """`env`, built from `cfg.env`, shows observations that fit in the context; raises ConfigError."""
    longest, context = env.observation_space.max_length, cfg.rollout.max_context_tokens
    if longest > context * CHARS_PER_TOKEN:
        options = ", ".join(f"env.options.{key}={value!r}" for key, value in cfg.env.options.items()) or "its options"
        raise ConfigError(
            f"{options}: env.name={cfg.env.name} then shows observations of up to {longest:,} characters, more than "
            f"rollout.max_context_tokens={context} tokens hold (at {CHARS_PER_TOKEN} characters a token at most); "
            "make the env smaller or the context longer"
        )
