"""The warm start's episode seeds: no SFT or tokenizer episode plays a validation task of an env whose
seeds index a data set (seed s plays item s % item_count), and the shipped model's own envs keep the
seeds they were built with."""

from __future__ import annotations

import pytest

from ragen_lit.envs import make_env
from ragen_lit.errors import ConfigError
from ragen_lit.presets.expert_episodes import SFT_SEED, EnvSetup, episode_seeds
from ragen_lit.presets.tiny.build import CORPUS_SEED, TinyRecipe


def test_seeds_of_held_out_items_are_skipped():
    # 10 items; validation seeds 3..4 are items 3 and 4, so seeds 13, 14, 23, 24 play them too
    assert episode_seeds(10, 10, 6, held_out=range(3, 5)) == [10, 11, 12, 15, 16, 17]
    assert episode_seeds(10, 10, 12, held_out=[3, 14]) == [10, 11, 12, 15, 16, 17, 18, 19, 20, 21, 22, 25]
    assert episode_seeds(10, 10, 3) == [10, 11, 12]


def test_generated_envs_keep_consecutive_seeds():
    assert episode_seeds(None, 7, 4, held_out=range(7, 100)) == [7, 8, 9, 10]


def test_an_env_whose_every_item_is_held_out_is_refused():
    with pytest.raises(ConfigError, match="every one of the env's 5 tasks"):
        episode_seeds(5, 0, 1, held_out=range(123, 130))


@pytest.mark.parametrize(
    "name, item_count",
    [("webshop", 1000), ("search_qa", 1200), ("coding", 520), ("mathqa", 1000), ("frozenlake", None)],
)
def test_item_count_of_the_envs(name, item_count):
    assert make_env(name).item_count == item_count


def test_countdown_item_count_follows_its_instances():
    assert make_env("countdown").item_count is None  # generated from the seed


@pytest.mark.parametrize("name", ["webshop", "search_qa", "coding"])
def test_sft_items_of_the_item_based_envs_miss_the_validation_items(name):
    recipe = TinyRecipe(extra_envs=(EnvSetup(name),), extra_env_episodes=400, val_envs=64)
    count = make_env(name).item_count
    seeds = episode_seeds(count, SFT_SEED, recipe.sft_episode_count(name), recipe.held_out_seeds())
    validation = {seed % count for seed in range(123, 123 + 64)}
    assert len(seeds) == 400 and not {seed % count for seed in seeds} & validation
    # before the split, seeds 6,000,000.. played items 0..399 of webshop and search_qa: validation's among them
    if name != "coding":
        assert {seed % count for seed in range(SFT_SEED, SFT_SEED + 400)} & validation


def test_the_shipped_models_envs_keep_their_seeds():
    recipe = TinyRecipe()
    for setup in recipe.setups():
        count = setup.make_env().item_count
        corpus = recipe.corpus_episodes if setup.name == "frozenlake" else recipe.corpus_episodes // 4
        for first, n in ((SFT_SEED, recipe.sft_episode_count(setup.name)), (CORPUS_SEED, corpus)):
            assert episode_seeds(count, first, n, recipe.held_out_seeds()) == list(range(first, first + n))


def test_held_out_seeds_cover_the_build_and_fit_validation():
    assert TinyRecipe(val_envs=32).held_out_seeds() == range(123, 123 + 64)  # fit validates on 64 by default
    assert TinyRecipe(val_envs=256).held_out_seeds() == range(123, 123 + 256)
