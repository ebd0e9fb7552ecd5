import warnings

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen_lit.envs import make_env
from ragen_lit.envs.sokoban import Room, SokobanEnv, dead_cells, generate_room, solve

# player (1, 1), box (1, 3), target (1, 4)
ONE_BOX = ["######", "#P_XO#", "#____#", "######"]
# box on target (1, 2), box (2, 3), targets (1, 2) and (1, 4)
TWO_BOXES = ["######", "#P√_O#", "#__X_#", "######"]


def env_for(grid, **options):
    env = SokobanEnv.from_grid(grid, **options)
    env.reset(seed=0)
    return env


def test_reset_observation_and_state():
    env = SokobanEnv.from_grid(ONE_BOX)
    obs, info = env.reset(seed=0)
    assert obs == (
        "Board size: 4 rows x 6 cols (zero-indexed).\n"
        "Player: (1, 1)\n"
        "Boxes: (1, 3)\n"
        "Targets: (1, 4)\n"
        "Grid:\n"
        "######\n"
        "#P_XO#\n"
        "#____#\n"
        "######"
    )
    assert info == {"success": False, "action_valid": True}
    assert env.player == (1, 1) and env.boxes == [(1, 3)] and env.targets == [(1, 4)]
    assert env.grid == ONE_BOX


def test_walk_then_push_box_onto_target_solves():
    env = env_for(ONE_BOX)
    obs, reward, terminated, truncated, info = env.step("Right")
    assert env.player == (1, 2) and env.boxes == [(1, 3)]
    assert reward == pytest.approx(-0.1) and (terminated, truncated) == (False, False)
    obs, reward, terminated, truncated, info = env.step("Right")
    assert env.player == (1, 3) and env.boxes == [(1, 4)]
    assert reward == pytest.approx(-0.1 + 1.0 + 10.0)
    assert (terminated, truncated) == (True, False)
    assert info == {"success": True, "action_valid": True}
    assert obs.splitlines()[-3] == "#__P√#"


def test_box_off_and_onto_targets_with_two_boxes():
    env = env_for(TWO_BOXES)
    obs, reward, terminated, _, info = env.step("Right")  # pushes the box off target (1, 2)
    assert env.player == (1, 2) and env.boxes == [(1, 3), (2, 3)]
    assert reward == pytest.approx(-0.1 - 1.0) and not terminated
    assert obs.splitlines()[1] == "Player: (1, 2) (on a target)"
    assert obs.splitlines()[-3:-1] == ["#_SXO#", "#__X_#"]
    obs, reward, terminated, _, info = env.step("Right")  # onto target (1, 4), one box still off
    assert env.boxes == [(1, 4), (2, 3)]
    assert reward == pytest.approx(-0.1 + 1.0) and not terminated and not info["success"]


@pytest.mark.parametrize(
    "grid, action",
    [
        (["#####", "#PXO#", "#####"], "Up"),  # walk into a wall
        (["#####", "#_PX#", "#_O_#", "#####"], "Right"),  # box against the wall
        (["######", "#PXXO#", "#O___#", "######"], "Right"),  # box against a box
    ],
)
def test_blocked_moves_are_valid_and_change_nothing(grid, action):
    env = env_for(grid)
    before = env.render()
    obs, reward, terminated, truncated, info = env.step(action)
    assert obs == before
    assert reward == pytest.approx(-0.1) and (terminated, truncated) == (False, False)
    assert info["action_valid"] is True and env.num_actions == 1


def test_invalid_action_keeps_state_and_budget():
    env = env_for(ONE_BOX)
    before = env.render()
    obs, reward, terminated, truncated, info = env.step("push")
    assert obs == before and reward == 0.0 and (terminated, truncated) == (False, False)
    assert info == {"success": False, "action_valid": False} and env.num_actions == 0


def test_truncates_after_the_action_budget():
    env = env_for(ONE_BOX, max_actions_per_episode=2)
    assert env.step("Left")[2:4] == (False, False)
    assert env.step("Left")[2:4] == (False, True)


def test_room_grid_round_trip_and_rejects_bad_grids():
    for grid in (ONE_BOX, TWO_BOXES, ["#####", "#S√X#", "#___#", "#####"]):
        assert Room.from_grid(grid).grid() == grid
    for bad in (["#P#"], ["#PXO#", "#P__#"], ["#PX_#"], ["#PXO", "#_"], ["#PXO#", "#?__#"]):
        with pytest.raises(ValueError, match="grid="):
            Room.from_grid(bad)


def test_solve_hand_made_rooms():
    assert solve(ONE_BOX) == ["Right", "Right"]
    assert solve(["#####", "#P_√#", "#####"]) == []
    assert solve(["#####", "#X_P#", "#__O#", "#####"]) is None  # box stuck in a corner
    assert dead_cells(Room.from_grid(ONE_BOX)) == {(1, 1), (2, 1), (2, 4)}


def test_solution_replays_to_success_in_the_env():
    grid = ["#######", "#__O__#", "#_X___#", "#__P__#", "#######"]
    solution = solve(grid)
    env = env_for(grid, max_actions_per_episode=len(solution))
    for action in solution:
        obs, reward, terminated, truncated, info = env.step(action)
    assert info["success"] and terminated and not truncated


def test_generated_rooms_are_solvable_deterministic_and_distinct():
    rooms = set()
    for seed in range(150):
        env_a, env_b = SokobanEnv(), SokobanEnv()
        assert env_a.reset(seed=seed)[0] == env_b.reset(seed=seed)[0]
        grid = env_a.grid
        assert grid[0] == grid[-1] == "######" and all(row[0] == row[-1] == "#" for row in grid)
        assert len(env_a.boxes) == len(env_a.targets) == 1 and not env_a.is_success
        solution = solve(grid)
        assert solution is not None and len(solution) >= 1
        rooms.add(tuple(grid))
    assert len(rooms) > 140


def test_larger_rooms_with_two_boxes_are_solvable():
    for seed in range(15):
        room = generate_room(8, 2, 300, seed)
        assert len(room.boxes) == 2 and not room.solved
        assert solve(room.grid()) is not None


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), size=st.integers(5, 7), search_depth=st.integers(1, 400))
def test_any_generated_room_is_solved_by_replaying_the_solver(seed, size, search_depth):
    env = SokobanEnv(size=size, search_depth=search_depth, max_actions_per_episode=1000)
    env.reset(seed=seed)
    for action in solve(env.grid):
        *_, info = env.step(action)
    assert info["success"]


def test_options_are_validated():
    with pytest.raises(ValueError, match=r"env\.options\.size=4 is not allowed"):
        make_env("sokoban", size=4)
    with pytest.raises(ValueError, match=r"env\.options\.num_boxes=5 is not allowed; expected at most 4"):
        make_env("sokoban", num_boxes=5)
    with pytest.raises(ValueError, match=r"env\.options\.search_depth=0 is not allowed"):
        make_env("sokoban", search_depth=0)
    assert make_env("sokoban", size=7, num_boxes=2).reset(seed=3)[0].startswith("Board size: 7 rows x 7 cols")


def test_gymnasium_make_and_env_checker():
    env = gymnasium.make("ragen_lit/Sokoban-v0", size=7)
    assert env.reset(seed=0)[0].startswith("Board size: 7 rows")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
        # A fixed-room env has no gymnasium spec to re-make it in each render mode.
        check_env(SokobanEnv.from_grid(TWO_BOXES), skip_render_check=True)
