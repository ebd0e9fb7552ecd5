"""`models.loaders`: the tested transformers range is the declared one, loading under a version outside
it warns once in one line, and the CI floors follow pyproject.toml."""

from __future__ import annotations

import importlib.util
import logging
import re
from pathlib import Path

import pytest
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers

from ragen_lit.models import TRANSFORMERS_RANGE, load_critic, load_policy, load_tokenizer, loaders

# loading under the installed transformers is what the floors run is for
pytestmark = pytest.mark.floors

ROOT = Path(__file__).resolve().parents[2]


def _dependency_floors_script():
    spec = importlib.util.spec_from_file_location("dependency_floors", ROOT / "scripts" / "dependency_floors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _declared(name: str) -> str:
    return next(r for r in _dependency_floors_script().runtime_requirements() if re.match(rf"{name}\b", r))


def test_the_tested_transformers_range_is_the_declared_one():
    lowest, excluded = TRANSFORMERS_RANGE
    assert _declared("transformers") == f"transformers>={lowest},<{excluded}"


@pytest.mark.parametrize(
    ("installed", "warns"),
    [("5.3.2", True), ("5.4.0", False), ("5.17.0", False), ("5.29.9", False), ("5.30.0.dev0", True), ("6.0", True)],
)
def test_a_version_outside_the_range_gets_one_line_naming_both(installed, warns):
    message = loaders.untested_transformers_message(installed)
    assert (message is not None) == warns
    if warns:
        lowest, excluded = TRANSFORMERS_RANGE
        assert installed in message and f">={lowest},<{excluded}" in message and "\n" not in message


@pytest.fixture
def model_dir(tmp_path):
    config = transformers.Qwen2Config(
        vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    transformers.Qwen2ForCausalLM(config).save_pretrained(tmp_path)
    vocab = {"<eos>": 0, **{chr(ord("a") + i): i + 1 for i in range(15)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>").save_pretrained(tmp_path)
    return str(tmp_path)


@pytest.fixture
def fresh_warning():
    loaders.warn_if_untested_transformers.cache_clear()
    yield
    loaders.warn_if_untested_transformers.cache_clear()


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == loaders.__name__ and r.levelno == logging.WARNING]


def test_loading_under_an_untested_transformers_warns_once(model_dir, monkeypatch, caplog, fresh_warning):
    monkeypatch.setattr(loaders, "installed_transformers", lambda: "5.3.0")
    with caplog.at_level(logging.WARNING):
        load_tokenizer(model_dir)
        load_policy(model_dir, "float32")
        load_critic(model_dir, "float32")
    assert _warnings(caplog) == [loaders.untested_transformers_message("5.3.0")]


def test_loading_under_the_installed_transformers_is_silent(model_dir, caplog, fresh_warning):
    # CI runs this at the floors and at the newest release: both must lie inside the declared range
    with caplog.at_level(logging.WARNING):
        load_tokenizer(model_dir)
        load_policy(model_dir, "float32")
    assert _warnings(caplog) == []


def test_every_floor_the_issue_names_is_pinned_for_the_floors_run():
    floors = _dependency_floors_script().dependency_floors()
    for name in ("torch", "transformers", "lightning", "torchmetrics", "mlflow"):
        assert _declared(name).startswith(f"{name}>={floors[name]}")
    assert floors["transformers"] == TRANSFORMERS_RANGE[0]


def test_the_readme_test_command_runs_the_floors_tests_in_the_floors_venv():
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert "bash .ci/floors_env.sh" in script
    # the tests marked cuda need a GPU, which CI lacks (they run with `pytest -m cuda` on one)
    assert re.search(r"\.venv-floors/bin/python -m pytest -m \"floors and not slow and not cuda\"", script)
    assert re.search(r"\.venv/bin/python -m pytest -m \"not vllm and not cuda\"", script)


def test_model_compile_auto_is_on_where_a_gpu_is_used(monkeypatch):
    from ragen_lit.models import resolve_compile

    monkeypatch.setattr(loaders.torch.cuda, "is_available", lambda: True)
    assert resolve_compile(None, "auto") and resolve_compile(None, "gpu")
    assert not resolve_compile(None, "cpu")  # a GPU machine told to use the CPU: as a CPU run always did
    monkeypatch.setattr(loaders.torch.cuda, "is_available", lambda: False)
    assert not resolve_compile(None, "auto")
    assert resolve_compile(True, "cpu") and not resolve_compile(False, "auto")  # an explicit setting wins
