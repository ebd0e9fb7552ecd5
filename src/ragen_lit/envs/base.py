"""The text-environment contract every ragen_lit environment follows (docs/METHOD.md §6, common rules).

An observation is a string, an action is one action name (discrete envs) or one answer string
(free-form envs). `TextEnv` owns the parts every env shares: seeding, the per-episode budget of
valid actions (the env truncates itself), invalid actions (state kept, reward 0, never raising),
the `info` dict and `render`. A subclass implements four hooks: `_new_episode(seed)`,
`_apply(action)`, `_observation()` and `is_success`. An env whose states repeat exactly may also define
`state_key()`, what GiGPO's anchor-state grouping compares (`algo.advantage=gigpo`).
"""

from __future__ import annotations

import numbers
import operator
import string
from collections.abc import Hashable
from typing import Any, ClassVar

import gymnasium
from gymnasium.spaces import Text

# Everything an env may emit or receive; `√` marks "on the goal/target" in grid observations and the
# arithmetic signs let a Countdown answer be written the way a model tends to write it.
CHARSET = frozenset(string.ascii_letters + string.digits + string.punctuation + " \n" + "√×÷−")
ACTION_MAX_LENGTH = 200


class OptionError(ValueError):
    """A constructor option with a bad value. The message starts with the option's name so that
    `make_env` can report it as `env.options.<key>=...`."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        self.key = key
        super().__init__(f"{key}={value!r} is not allowed; expected {allowed}")


def check_int(key: str, value: Any, minimum: int) -> int:
    """`value` as an int >= `minimum` (bools are rejected: `size=True` is a config mistake)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise OptionError(key, value, f"an integer >= {minimum}")
    return int(value)


def check_probability(key: str, value: Any, allow_zero: bool) -> float:
    """`value` as a float in (0, 1] (or [0, 1] when `allow_zero`)."""
    allowed = "a number in [0, 1]" if allow_zero else "a number in (0, 1]"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise OptionError(key, value, allowed)
    if not (0.0 <= value <= 1.0) or (value == 0.0 and not allow_zero):
        raise OptionError(key, value, allowed)
    return float(value)


class TextEnv(gymnasium.Env[str, str]):
    """Base of all text environments.

    `step(action)` returns `(observation, reward, terminated, truncated, info)` with
    `info = {"success": bool, "action_valid": bool}`. An action that `parse_action` cannot map is
    invalid: the state stays, the reward is 0 and it does not use up the action budget. After
    `max_actions_per_episode` valid actions the episode is truncated unless it terminated.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 4}
    instruction: ClassVar[str] = ""
    actions: ClassVar[tuple[str, ...] | None] = None
    # The reference validates on seeds 123..634 and trains on seeds from 10000 upwards (docs/METHOD.md §6).
    validation_seeds: ClassVar[range] = range(123, 123 + 512)
    train_seed_base: ClassVar[int] = 10000
    # True for envs whose `step` mostly waits (a subprocess, I/O): the rollout loop then steps all of a turn's
    # episodes of this env at once, in threads, instead of one after another
    steps_wait: ClassVar[bool] = False

    @property
    def item_count(self) -> int | None:
        """How many distinct instances the seeds play, for envs that read them from a data set: seed s plays
        item `s % item_count`, so seeds that agree modulo it are the same task (a warm start that must not
        see the validation tasks draws its seeds by it: presets/tiny/build.py). None when every seed makes
        its own instance."""
        return None

    def __init__(
        self,
        *,
        max_actions_per_episode: int,
        observation_max_length: int,
        observation_charset: frozenset[str] = CHARSET,
        render_mode: str | None = None,
    ) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise OptionError("render_mode", render_mode, "None or 'ansi'")
        self.render_mode = render_mode
        self.max_actions_per_episode = check_int("max_actions_per_episode", max_actions_per_episode, 1)
        self.observation_space = Text(max_length=observation_max_length, charset=observation_charset)
        self.action_space = Text(max_length=ACTION_MAX_LENGTH, min_length=0, charset=CHARSET)
        self.instance_seed: int | None = None
        self.num_actions = 0
        self._started = False
        self._episode_over = True

    # ----------------------------------------------------------------------------- gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, bool]]:
        """Start the instance of `seed` (the same seed always gives the same instance); without a
        seed, the instance seed is drawn from the env's generator, itself seeded by the last seed."""
        # numpy integers are accepted too (gymnasium's seeding takes only a Python int).
        seed = None if seed is None else operator.index(seed)
        super().reset(seed=seed)
        if seed is None:
            seed = int(self.np_random.integers(2**31 - 1))
        self.instance_seed = seed
        self.num_actions = 0
        self._new_episode(seed)
        self._started = True
        self._episode_over = False
        return self._observation(), self._info(action_valid=True)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, bool]]:
        if self._episode_over:
            raise RuntimeError(f"{type(self).__name__}.step() called before reset() or after the episode ended")
        parsed = self.parse_action(action) if isinstance(action, str) else None
        if parsed is None:
            return self._observation(), 0.0, False, False, self._info(action_valid=False)
        reward, terminated = self._apply(parsed)
        self.num_actions += 1
        truncated = not terminated and self.num_actions >= self.max_actions_per_episode
        self._episode_over = terminated or truncated
        return self._observation(), float(reward), terminated, truncated, self._info(action_valid=True)

    def render(self) -> str:
        """The current text observation (render mode "ansi")."""
        if not self._started:
            raise RuntimeError(f"{type(self).__name__}.render() called before reset()")
        return self._observation()

    def parse_action(self, text: str) -> str | None:
        """The canonical action for `text` (case- and whitespace-insensitive), or None if unknown.
        Free-form envs (`actions is None`) return the stripped text, None when it is empty."""
        if not isinstance(text, str):
            return None
        if self.actions is None:
            return text.strip() or None
        key = "".join(text.split()).lower()
        return next((name for name in self.actions if name.lower() == key), None)

    # ------------------------------------------------------------------------- subclass hooks
    @property
    def is_success(self) -> bool:
        raise NotImplementedError

    def _new_episode(self, seed: int) -> None:
        """Build the instance of `seed` and reset the episode state."""
        raise NotImplementedError

    def _apply(self, action: str) -> tuple[float, bool]:
        """Execute one parsed (valid) action; return `(reward, terminated)`."""
        raise NotImplementedError

    def _observation(self) -> str:
        raise NotImplementedError

    def _info(self, action_valid: bool) -> dict[str, bool]:
        return {"success": bool(self.is_success), "action_valid": action_valid}

    def state_key(self) -> Hashable | None:
        """What makes two moments of this instance the same environment state for GiGPO's anchor-state
        grouping (equal keys = identical states; the instance itself is implicit, since only rollouts of one
        group, one seed, are compared). Only what the future depends on belongs in it (FrozenLake: the
        player's cell). None (this default): the env has no such notion and cannot train with `gigpo`."""
        return None


def has_state_key(env_class: type[TextEnv]) -> bool:
    """Whether `env_class` defines `TextEnv.state_key` (can form GiGPO's anchor states)."""
    return getattr(env_class, "state_key", None) is not TextEnv.state_key


def format_cell(cell: tuple[int, int]) -> str:
    """`(r, c)`, the coordinate notation of every grid observation."""
    return f"({cell[0]}, {cell[1]})"


def format_cells(cells: list[tuple[int, int]]) -> str:
    return ", ".join(format_cell(cell) for cell in cells) if cells else "none"
