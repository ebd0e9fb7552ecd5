"""The tiny model ships in the package: `model.name=tiny` loads it without building, and its build record
names the builder's current recipe (a recipe change must come with a rebuilt shipped folder)."""

from __future__ import annotations

import json

import pytest

from ragen_lit.config import ModelConfig
from ragen_lit.errors import ConfigError
from ragen_lit.models import load_policy, load_tokenizer
from ragen_lit.presets import resolve_model_path
from ragen_lit.presets import tiny as tiny_preset
from ragen_lit.presets.tiny import SHIPPED
from ragen_lit.presets.tiny.build import BUILD_INFO, TinyRecipe, same_recipe


def test_model_name_tiny_resolves_to_the_shipped_folder_without_building(monkeypatch):
    import ragen_lit.presets.tiny.build as build

    def no_build(*args, **kwargs):
        raise AssertionError("the shipped model must not be rebuilt")

    monkeypatch.setattr(build, "build_tiny_model", no_build)
    assert resolve_model_path(ModelConfig(name="tiny")) == str(SHIPPED)


def test_the_shipped_build_record_is_the_builders_recipe():
    record = json.loads((SHIPPED / BUILD_INFO).read_text())
    assert same_recipe(record["recipe"], TinyRecipe())
    assert record["summary"]["val_success"] >= TinyRecipe().min_val_success


def test_the_shipped_model_loads_and_its_tokenizer_round_trips():
    tokenizer = load_tokenizer(str(SHIPPED))
    policy = load_policy(str(SHIPPED), dtype="float32")
    assert (
        sum(p.numel() for p in policy.parameters())
        == json.loads((SHIPPED / BUILD_INFO).read_text())["summary"]["parameters"]
    )
    text = "<think>I go Left.</think><answer>Left</answer>"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_a_missing_shipped_folder_is_one_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(tiny_preset, "SHIPPED", tmp_path / "shipped")
    with pytest.raises(ConfigError, match="model.name=tiny: the tiny model's weights are missing"):
        resolve_model_path(ModelConfig(name="tiny"))
