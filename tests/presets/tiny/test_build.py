"""Building the tiny model with a reduced budget: loadable by the Auto classes, follows the response
format greedily, cached per recipe, safe under concurrent builders."""

from __future__ import annotations

import dataclasses
import json
import threading

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ragen_lit.agent.chat import ChatFormat
from ragen_lit.agent.rollout import EpisodeLimits, rollout
from ragen_lit.engines.base import SamplingParams
from ragen_lit.engines.hf import HFEngine
from ragen_lit.envs import make_env
from ragen_lit.presets.tiny.build import BUILD_INFO, FOLDER_NAME, TinyRecipe, build_tiny_model

SMALL = TinyRecipe(
    vocab_size=600,
    corpus_episodes=16,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    sft_episodes=200,
    other_env_episodes=4,
    sft_steps=120,
    batch_size=8,
    learning_rate=1e-2,
    epsilon=0.15,
    val_envs=2,
    min_val_success=0.0,
    threads=1,
)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny") / "model"
    lines = []
    assert build_tiny_model(folder, recipe=SMALL, log=lines.append) == folder
    return folder, lines


@pytest.mark.slow
def test_summary_line_and_build_record(built):
    folder, lines = built
    assert len(lines) == 1 and lines[0].startswith("tiny model: ") and "120 SFT steps" in lines[0]
    record = json.loads((folder / BUILD_INFO).read_text())
    assert record["recipe"]["sft_steps"] == 120
    summary = record["summary"]
    assert summary["sft_steps"] == 120 and summary["val_envs"] == 2 and 0.0 <= summary["val_success"] <= 1.0
    assert summary["final_loss"] < 2.0


@pytest.mark.slow
def test_no_staging_folders_are_left(built):
    folder, _ = built
    assert sorted(p.name for p in folder.parent.iterdir()) == ["model", "model.lock"]


def test_auto_classes_load_it_and_the_tokenizer_is_unchanged(built):
    folder, _ = built
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    text = "Player at (0, 1), goal at (3, 3). Right leads to (0, 2).</think><answer>Right || Down</answer>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    assert tokenizer.convert_tokens_to_ids("</answer>") == ids[-1]


def test_greedy_output_follows_the_format(built):
    folder, _ = built
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    engine = HFEngine(model, pad_token_id=tokenizer.pad_token_id)
    seeds = [123, 124, 125, 126]
    trajectories = rollout(
        engine,
        lambda: make_env("frozenlake"),
        seeds,
        seeds,
        ChatFormat(tokenizer),
        EpisodeLimits(),
        SamplingParams(temperature=0.0),
    )
    turns = [turn for t in trajectories for turn in t.turns]
    # a reduced build budget (120 SFT steps): the format must hold on most turns, not all
    well_formed = [
        turn.reasoning is not None and turn.reasoning.startswith("Player at (") and turn.valid for turn in turns
    ]
    assert sum(well_formed) >= 0.75 * len(turns), [(t.reasoning, t.actions) for t in turns]


def test_same_recipe_is_reused_and_another_is_rebuilt(built, tmp_path):
    folder, _ = built
    lines = []
    weights = (folder / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model(folder, recipe=SMALL, log=lines.append) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == weights
    assert lines == []
    other = tmp_path / "other"
    (other).mkdir()
    (other / BUILD_INFO).write_text(json.dumps({"recipe": {"seed": -1}}))
    cheap = dataclasses.replace(SMALL, sft_steps=2, val_envs=0, sft_episodes=8)
    build_tiny_model(other, recipe=cheap, log=lines.append)
    assert json.loads((other / BUILD_INFO).read_text())["recipe"]["sft_steps"] == 2
    assert "validation success skipped" in lines[0]


def test_concurrent_builders_build_once(tmp_path):
    cheap = dataclasses.replace(SMALL, sft_steps=2, val_envs=0, sft_episodes=8)
    lines, results = [], []
    threads = torch.get_num_threads()
    workers = [
        threading.Thread(
            target=lambda: results.append(build_tiny_model(tmp_path / "m", recipe=cheap, log=lines.append))
        )
        for _ in range(2)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert results == [tmp_path / "m", tmp_path / "m"]
    assert len(lines) == 1
    assert torch.get_num_threads() == threads


def test_default_folder_is_tiny_v1_in_the_user_cache(monkeypatch, tmp_path):
    # A folder holding this recipe's build record is reused as is, so nothing is built here.
    folder = tmp_path / "cache" / "tiny-v1"
    folder.mkdir(parents=True)
    (folder / BUILD_INFO).write_text(json.dumps({"recipe": dataclasses.asdict(SMALL)}))
    monkeypatch.setenv("RAGEN_LIT_CACHE", str(tmp_path / "cache"))
    assert FOLDER_NAME == "tiny-v1"
    assert build_tiny_model(recipe=SMALL) == folder


@pytest.mark.slow
def test_a_weak_sft_attempt_is_retried_and_the_best_attempt_is_kept(tmp_path):
    from ragen_lit.presets.tiny.build import validation_success

    recipe = dataclasses.replace(SMALL, sft_steps=20, sft_episodes=40, val_envs=8, min_val_success=1.01, max_attempts=2)
    lines = []
    folder = build_tiny_model(tmp_path / "model", recipe=recipe, log=lines.append)
    summary = json.loads((folder / BUILD_INFO).read_text())["summary"]
    assert len(summary["attempts"]) == 2  # the bar is unreachable: both attempts run
    assert summary["val_success"] == max(summary["attempts"])
    assert "best of 2 SFT attempts" in lines[0]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert (
        validation_success(model, ChatFormat(tokenizer), recipe) == summary["val_success"]
    )  # the saved model is the reported one


def test_a_good_first_attempt_is_not_retried(tmp_path):
    recipe = dataclasses.replace(SMALL, sft_steps=20, sft_episodes=40, val_envs=2, min_val_success=0.0, max_attempts=3)
    folder = build_tiny_model(tmp_path / "model", recipe=recipe, log=lambda _: None)
    assert len(json.loads((folder / BUILD_INFO).read_text())["summary"]["attempts"]) == 1


def test_extra_envs_join_the_tokenizer_corpus_and_the_sft(tmp_path):
    from ragen_lit.agent.rollout import EpisodeLimits
    from ragen_lit.presets.expert_episodes import EnvSetup
    from ragen_lit.presets.tiny.build import same_recipe, tokenizer_corpus

    search = EnvSetup("search_qa", {"max_searches": 2}, EpisodeLimits(max_turns=3, max_actions_per_turn=1))
    recipe = dataclasses.replace(SMALL, corpus_episodes=4, extra_envs=(search,))
    assert recipe.envs() == ("countdown", "frozenlake", "mathqa", "sokoban", "search_qa")
    assert recipe.sft_episode_count("search_qa") == recipe.extra_env_episodes
    # played with the setup's options and limits: 2 searches, one action per turn
    assert any("Searches left: 2" in text for text in tokenizer_corpus(recipe))
    assert not any("Searches left: 3" in text for text in tokenizer_corpus(recipe))
    cheap = dataclasses.replace(recipe, sft_steps=4, sft_episodes=8, extra_env_episodes=2, max_attempts=1)
    lines = []
    summary = json.loads((build_tiny_model(tmp_path / "m", recipe=cheap, log=lines.append) / BUILD_INFO).read_text())
    assert summary["summary"]["sft_episodes"] == 8 + 3 * 4 + 2
    assert list(summary["summary"]["extra_val_success"]) == ["search_qa"]  # validated on the extra env too
    assert "(search_qa " in lines[0]
    unvalidated = dataclasses.replace(cheap, val_envs=0)
    summary = json.loads(
        (build_tiny_model(tmp_path / "n", recipe=unvalidated, log=lambda _: None) / BUILD_INFO).read_text()
    )
    assert summary["summary"]["val_success"] is None and "extra_val_success" not in summary["summary"]
    assert not any("Searches left" in text for text in tokenizer_corpus(dataclasses.replace(SMALL, corpus_episodes=4)))
    # a record that predates a field counts it at its default; the field as JSON stores it (a list) matches
    recorded = json.loads(json.dumps(dataclasses.asdict(recipe)))
    assert same_recipe(recorded, recipe) and not same_recipe(recorded, SMALL)
    legacy = {k: v for k, v in dataclasses.asdict(SMALL).items() if k != "extra_envs"}
    assert same_recipe(legacy, SMALL) and not same_recipe(legacy, recipe) and not same_recipe(None, SMALL)
