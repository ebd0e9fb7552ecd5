import warnings
from collections import Counter

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen_lit.envs import make_env
from ragen_lit.envs.frozenlake import FrozenLakeEnv, generate_map, path_exists

# start (0, 0), goal (3, 3), holes (1, 1), (1, 3), (2, 3), (3, 0)
BOARD = ["SFFF", "FHFH", "FFFH", "HFFG"]


def board_env(**options):
    env = FrozenLakeEnv.from_grid(BOARD, **options)
    env.reset(seed=0)
    return env


def test_reset_observation_and_state():
    env = FrozenLakeEnv.from_grid(BOARD)
    obs, info = env.reset(seed=0)
    assert obs == (
        "Board size: 4 rows x 4 cols (zero-indexed).\n"
        "Player: (0, 0)\n"
        "Goal: (3, 3)\n"
        "Holes: (1, 1), (1, 3), (2, 3), (3, 0)\n"
        "Grid:\n"
        "P___\n"
        "_O_O\n"
        "___O\n"
        "O__G"
    )
    assert info == {"success": False, "action_valid": True}
    assert env.size == 4 and env.grid == BOARD
    assert env.start == (0, 0) and env.player == (0, 0) and env.goal == (3, 3)
    assert env.holes == [(1, 1), (1, 3), (2, 3), (3, 0)]
    assert env.render() == obs


def test_walk_to_goal_exact_transitions():
    env = board_env()
    expected = [
        ("Down", (1, 0)),
        ("Down", (2, 0)),
        ("Right", (2, 1)),
        ("Right", (2, 2)),
        ("Down", (3, 2)),
    ]
    for action, cell in expected:
        obs, reward, terminated, truncated, info = env.step(action)
        assert env.player == cell
        assert (reward, terminated, truncated) == (0.0, False, False)
        assert info == {"success": False, "action_valid": True}
    obs, reward, terminated, truncated, info = env.step("Right")
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info == {"success": True, "action_valid": True}
    assert obs.splitlines()[1] == "Player: (3, 3) (on the goal)"
    assert obs.splitlines()[-4:] == ["____", "_O_O", "___O", "O__√"]


def test_falling_into_a_hole_terminates_without_reward():
    env = board_env()
    env.step("Right")
    obs, reward, terminated, truncated, info = env.step("Down")
    assert env.player == (1, 1)
    assert (reward, terminated, truncated) == (0.0, True, False)
    assert info == {"success": False, "action_valid": True}
    assert obs.splitlines()[1] == "Player: (1, 1) (in a hole)"
    assert obs.splitlines()[-4:] == ["____", "_X_O", "___O", "O__G"]


def test_moving_into_the_border_is_valid_and_stays():
    env = board_env()
    for action in ("Left", "Up"):
        obs, reward, terminated, truncated, info = env.step(action)
        assert env.player == (0, 0)
        assert (reward, terminated, truncated, info["action_valid"]) == (0.0, False, False, True)
    assert env.num_actions == 2


@pytest.mark.parametrize("action", ["Jump", "", "Left || Right", "   ", 3, None])
def test_invalid_action_keeps_state_and_budget(action):
    env = board_env()
    env.step("Right")
    before = env.render()
    obs, reward, terminated, truncated, info = env.step(action)
    assert obs == before and env.player == (0, 1)
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info == {"success": False, "action_valid": False}
    assert env.num_actions == 1


@pytest.mark.parametrize("text, expected", [("down", "Down"), ("  UP \n", "Up"), ("le ft", "Left"), ("Rightt", None)])
def test_parse_action_is_case_and_whitespace_insensitive(text, expected):
    assert FrozenLakeEnv().parse_action(text) == expected


def test_truncates_after_the_action_budget_of_valid_actions():
    env = board_env(max_actions_per_episode=3)
    assert env.step("Left")[3] is False
    assert env.step("nonsense")[3] is False
    assert env.step("Left")[3] is False
    obs, reward, terminated, truncated, info = env.step("Left")
    assert (terminated, truncated) == (False, True)
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("Left")


def test_reaching_the_goal_on_the_last_budgeted_action_terminates_not_truncates():
    env = FrozenLakeEnv.from_grid(["SG", "FF"], max_actions_per_episode=1)
    env.reset(seed=0)
    assert env.step("Right")[1:4] == (1.0, True, False)


def test_step_before_reset_raises():
    with pytest.raises(RuntimeError, match="before reset"):
        FrozenLakeEnv().step("Up")


def test_slip_frequencies_match_success_rate():
    open_map = ["FFFFF", "FFFFF", "FFSFF", "FFFFF", "FFFFG"]
    env = FrozenLakeEnv.from_grid(open_map, success_rate=0.8)
    moves = Counter()
    for seed in range(3000):
        env.reset(seed=seed)
        env.step("Up")
        moves[env.player] += 1
    # Up from (2, 2): intended (1, 2); perpendicular Left (2, 1) and Right (2, 3).
    assert set(moves) == {(1, 2), (2, 1), (2, 3)}
    assert moves[(1, 2)] / 3000 == pytest.approx(0.8, abs=0.03)
    assert moves[(2, 1)] / 3000 == pytest.approx(0.1, abs=0.02)
    assert moves[(2, 3)] / 3000 == pytest.approx(0.1, abs=0.02)


def test_slippery_episode_replays_per_seed():
    env = FrozenLakeEnv(size=6, p=1.0, success_rate=0.5, max_actions_per_episode=30)

    def trace(seed):
        env.reset(seed=seed)
        cells = []
        for action in ["Right", "Down", "Left", "Up"] * 5:
            env.step(action)
            cells.append(env.player)
            if env.is_success:
                break
        return cells

    assert trace(7) == trace(7)
    assert any(trace(7) != trace(seed) for seed in range(8, 12))


def test_generated_maps_are_solvable_deterministic_and_distinct():
    maps = []
    for seed in range(300):
        env_a, env_b = FrozenLakeEnv(), FrozenLakeEnv()
        obs_a, _ = env_a.reset(seed=seed)
        obs_b, _ = env_b.reset(seed=seed)
        assert obs_a == obs_b and env_a.grid == env_b.grid
        flat = "".join(env_a.grid)
        assert flat.count("S") == 1 and flat.count("G") == 1 and env_a.start != env_a.goal
        assert path_exists(env_a.grid, env_a.start, env_a.goal)
        maps.append(tuple(env_a.grid))
    assert len(set(maps)) > 290


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), size=st.integers(2, 8), p=st.floats(0.05, 1.0))
def test_generate_map_always_has_a_path(seed, size, p):
    grid = generate_map(size, p, seed)
    cells = {grid[r][c]: (r, c) for r in range(size) for c in range(size)}
    assert path_exists(grid, cells["S"], cells["G"])


def test_map_without_holes_says_none():
    obs, _ = FrozenLakeEnv(size=3, p=1.0).reset(seed=1)
    assert "Holes: none" in obs.splitlines()


def test_unseeded_reset_follows_the_last_seed():
    env = FrozenLakeEnv()
    env.reset(seed=3)
    first = env.reset()[0]
    env.reset(seed=3)
    assert env.reset()[0] == first


def test_observations_stay_inside_the_text_space():
    env = FrozenLakeEnv(size=12, p=0.3)
    for seed in range(20):
        obs, _ = env.reset(seed=seed)
        assert obs in env.observation_space


@pytest.mark.parametrize("grid", [["SF", "FH"], ["SG", "F"], ["SGG", "FFF", "FFF"], ["SX", "FG"], ["S"], ["SS", "GG"]])
def test_from_grid_rejects_bad_maps(grid):
    with pytest.raises(ValueError, match="grid="):
        FrozenLakeEnv.from_grid(grid)


def test_seed_ranges():
    assert FrozenLakeEnv.validation_seeds == range(123, 635)
    assert FrozenLakeEnv.train_seed_base == 10000


def test_make_env_validates_options():
    with pytest.raises(ValueError, match=r"env\.options\.size=1 is not allowed"):
        make_env("frozenlake", size=1)
    with pytest.raises(ValueError, match=r"env\.options\.p=1\.5 is not allowed"):
        make_env("FrozenLake", p=1.5)
    with pytest.raises(ValueError, match=r"env\.options\.bar is not an option of frozenlake; allowed: size, p, "):
        make_env("frozenlake", bar=1)
    assert make_env("frozenlake", size=5).size == 5


def test_gymnasium_make_and_env_checker():
    env = gymnasium.make("ragen_lit/FrozenLake-v0", success_rate=0.8)
    obs, info = env.reset(seed=1)
    assert obs.startswith("Board size: 4 rows x 4 cols")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
