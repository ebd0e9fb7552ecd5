import importlib
import os
import subprocess
import sys

import gymnasium
import pytest

import ragen_lit.envs
from ragen_lit.envs import (
    ENV_CLASSES,
    CodingEnv,
    CountdownEnv,
    FrozenLakeEnv,
    MathQAEnv,
    SearchQAEnv,
    SokobanEnv,
    WebShopEnv,
    make_env,
    option_names,
)


def test_env_classes_keys():
    assert ENV_CLASSES == {
        "coding": CodingEnv,
        "countdown": CountdownEnv,
        "frozenlake": FrozenLakeEnv,
        "mathqa": MathQAEnv,
        "search_qa": SearchQAEnv,
        "sokoban": SokobanEnv,
        "webshop": WebShopEnv,
    }


def test_unknown_env_name():
    message = f"env.name='foo' is not a known environment; allowed: {', '.join(sorted(ENV_CLASSES))}"
    with pytest.raises(ValueError, match="^" + message.replace(".", r"\.") + "$"):
        make_env("foo")


def test_unknown_option_lists_the_allowed_ones_in_signature_order():
    assert option_names(FrozenLakeEnv) == ["size", "p", "success_rate", "max_actions_per_episode", "render_mode"]
    with pytest.raises(
        ValueError,
        match=r"^env\.options\.bar is not an option of frozenlake; allowed: size, p, success_rate, "
        r"max_actions_per_episode, render_mode$",
    ):
        make_env("frozenlake", bar=1)
    with pytest.raises(ValueError, match=r"^env\.options\.size is not an option of mathqa; allowed: path, "):
        make_env("mathqa", size=4)


def test_make_env_passes_options():
    env = make_env("FrozenLake", size=3, p=1.0, success_rate=0.5, max_actions_per_episode=4)
    assert (env.size, env.p, env.success_rate, env.max_actions_per_episode) == (3, 1.0, 0.5, 4)


@pytest.mark.parametrize(
    "env_id, env_class",
    [
        ("ragen_lit/FrozenLake-v0", FrozenLakeEnv),
        ("ragen_lit/Sokoban-v0", SokobanEnv),
        ("ragen_lit/Countdown-v0", CountdownEnv),
        ("ragen_lit/MathQA-v0", MathQAEnv),
        ("ragen_lit/Coding-v0", CodingEnv),
        ("ragen_lit/SearchQA-v0", SearchQAEnv),
        ("ragen_lit/WebShop-v0", WebShopEnv),
    ],
)
def test_registered_with_gymnasium(env_id, env_class):
    env = gymnasium.make(env_id)
    assert isinstance(env.unwrapped, env_class)
    obs, info = env.reset(seed=123)
    assert isinstance(obs, str) and info["success"] is False


def test_reimport_does_not_register_twice():
    importlib.reload(ragen_lit.envs)
    assert "ragen_lit/FrozenLake-v0" in gymnasium.registry


def test_importing_the_package_alone_registers_the_envs():
    """A fresh interpreter that imports only `ragen_lit` (not `ragen_lit.envs`) can make every env."""
    code = (
        "import ragen_lit, gymnasium\n"
        "for env_id in ('ragen_lit/FrozenLake-v0', 'ragen_lit/Sokoban-v0', 'ragen_lit/Countdown-v0', "
        "'ragen_lit/MathQA-v0', 'ragen_lit/Coding-v0', 'ragen_lit/SearchQA-v0', 'ragen_lit/WebShop-v0'):\n"
        "    gymnasium.make(env_id)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy())
    assert result.returncode == 0, result.stderr
