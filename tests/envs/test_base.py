import numpy as np
import pytest

from ragen_lit.envs import ENV_CLASSES, FrozenLakeEnv, SokobanEnv, has_state_key
from ragen_lit.envs.base import CHARSET, OptionError, TextEnv, check_int, check_probability, format_cells


@pytest.mark.parametrize("name", sorted(ENV_CLASSES))
def test_contract_shared_by_every_env(name):
    env_class = ENV_CLASSES[name]
    env, twin = env_class(), env_class()
    obs, info = env.reset(seed=11)
    assert info == {"success": False, "action_valid": True}
    assert twin.reset(seed=11)[0] == obs and env.render() == obs
    assert obs in env.observation_space and env.instance_seed == 11
    assert env_class.validation_seeds == range(123, 635) and env_class.train_seed_base == 10000
    assert env.instruction and "\n" not in env.instruction
    assert set(env.instruction) <= CHARSET
    expected_budget = {
        "frozenlake": 10,
        "sokoban": 10,
        "countdown": 1,
        "mathqa": 1,
        "coding": 1,
        "search_qa": 4,
        "webshop": 9,
    }[name]
    assert env.max_actions_per_episode == expected_budget
    assert env.metadata["render_modes"] == ["ansi"]


@pytest.mark.parametrize("name", sorted(ENV_CLASSES))
def test_unknown_action_never_raises(name):
    env = ENV_CLASSES[name]()
    env.reset(seed=0)
    before = env.render()
    for action in ("", "   ", None, 7, b"Up"):
        obs, reward, terminated, truncated, info = env.step(action)
        assert obs == before and reward == 0.0 and not terminated and not truncated
        assert info == {"success": False, "action_valid": False}


def test_parse_action_discrete_and_free_form():
    discrete = ENV_CLASSES["sokoban"]()
    assert discrete.parse_action(" rIGHT ") == "Right" and discrete.parse_action("Rightward") is None
    free_form = ENV_CLASSES["countdown"]()
    assert free_form.actions is None
    assert free_form.parse_action("  1 + 2 \n") == "1 + 2" and free_form.parse_action(" \t ") is None


def test_numpy_integer_seeds_are_accepted():
    env = ENV_CLASSES["frozenlake"]()
    assert env.reset(seed=np.int64(5))[0] == env.reset(seed=5)[0]


def test_render_before_reset_raises():
    with pytest.raises(RuntimeError, match="before reset"):
        ENV_CLASSES["frozenlake"]().render()


def test_option_checks():
    assert check_int("size", 3, 2) == 3
    assert check_probability("p", 1, allow_zero=False) == 1.0
    assert check_probability("success_rate", 0, allow_zero=True) == 0.0
    for bad in (True, 1.0, "3", 1):
        with pytest.raises(OptionError, match="size=.* is not allowed; expected an integer >= 2") as caught:
            check_int("size", bad, 2)
        assert caught.value.key == "size"
    for bad in (0, -0.1, 1.01, "0.5", None, False):
        with pytest.raises(ValueError, match=r"p=.* is not allowed; expected a number in \(0, 1\]"):
            check_probability("p", bad, allow_zero=False)
    with pytest.raises(ValueError, match="render_mode='human'"):
        ENV_CLASSES["frozenlake"](render_mode="human")


def test_format_cells():
    assert format_cells([]) == "none"
    assert format_cells([(0, 1), (10, 2)]) == "(0, 1), (10, 2)"


def test_every_env_is_a_text_env():
    assert all(issubclass(env_class, TextEnv) for env_class in ENV_CLASSES.values())


def test_state_key_hook_says_which_envs_have_anchor_states():
    assert {name for name, cls in ENV_CLASSES.items() if has_state_key(cls)} >= {"frozenlake", "sokoban"}
    assert not has_state_key(ENV_CLASSES["countdown"]) and not has_state_key(ENV_CLASSES["mathqa"])
    countdown = ENV_CLASSES["countdown"]()
    countdown.reset(seed=0)
    assert countdown.state_key() is None  # the default: no notion of identical states


def test_frozenlake_state_key_is_the_players_cell():
    env = FrozenLakeEnv.from_grid(["SFF", "FHF", "FFG"])
    env.reset(seed=0)
    assert env.state_key() == (0, 0)
    env.step("Right")
    assert env.state_key() == (0, 1)
    env.step("Left")
    assert env.state_key() == (0, 0)  # back where it started: the same anchor state


def test_sokoban_state_key_is_player_and_boxes():
    env = SokobanEnv.from_grid(["######", "#P_XO#", "#____#", "#____#", "######"])
    env.reset(seed=0)
    start = env.state_key()
    assert start == ((1, 1), ((1, 3),))
    env.step("Right")  # the player moves, the box stays
    assert env.state_key() == ((1, 2), ((1, 3),)) != start
    env.step("Down")
    env.step("Up")  # same player cell as after the first move, box unmoved: the same state
    assert env.state_key() == ((1, 2), ((1, 3),))
    assert hash(env.state_key()) is not None
