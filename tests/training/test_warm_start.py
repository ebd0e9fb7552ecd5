"""`python -m ragen_lit warm-start` end to end on the shipped tiny model on CPU (a folder `fit` can load, its
record, a lower SFT loss on the expert's episodes, replies no less often in format), and bad input as one
`error:` line with exit 2 before any model is trained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ragen_lit.agent.chat import ChatFormat
from ragen_lit.cli import main
from ragen_lit.config import load_config
from ragen_lit.models import load_policy, load_tokenizer
from ragen_lit.presets import resolve_model_path
from ragen_lit.presets.expert_episodes import SFT_SEED, EnvSetup, expert_episodes
from ragen_lit.presets.sft import sft_batch, sft_loss
from ragen_lit.presets.tiny.expert import ExpertEngine
from ragen_lit.training.warm_start import RECORD, continue_command

CONF = str(Path(__file__).resolve().parents[2] / "conf" / "frozenlake.yaml")
CHEAP = ["--episodes", "8", "--steps", "6", "--batch-size", "4", "--lr", "1e-3", "--val-envs", "2"]


def expert_loss(folder: str, options: list[str]) -> float:
    """The SFT loss of the model in `folder` on the 8 expert episodes warm-start trains on (epsilon 0.45, seed 0)."""
    cfg = load_config(CONF, options)
    tokenizer = load_tokenizer(folder)
    expert = ExpertEngine(tokenizer, epsilon=0.45, seed=0)
    episodes = expert_episodes(expert, ChatFormat(tokenizer), EnvSetup.of(cfg.env, cfg.rollout), SFT_SEED, 8)
    model = load_policy(folder, "float32")
    with torch.no_grad():
        return sft_loss(model, sft_batch(episodes, tokenizer.pad_token_id)).item()


@pytest.mark.slow
def test_warm_start_writes_a_model_fit_can_load_and_its_record(tmp_path, capsys):
    out = tmp_path / "warm"
    overrides = ["trainer.accelerator=cpu", "rollout.max_turns=3"]
    # overrides before and after the flags, as for fit
    assert main(["warm-start", "--config", CONF, overrides[0], "--out", str(out), *CHEAP, overrides[1]]) == 0
    printed = capsys.readouterr().out
    assert f"model.name=hf model.path={out}" in printed and "rollout.max_turns=3" in printed

    record = json.loads((out / RECORD).read_text())
    assert record["source_model"] == resolve_model_path(load_config(None, []).model)
    assert record["env"]["name"] == "frozenlake" and record["env"]["limits"]["max_turns"] == 3
    assert record["options"]["steps"] == 6 and record["options"]["lr"] == 1e-3 and record["options"]["episodes"] == 8
    assert 0.0 < record["expert_success"] <= 1.0 and record["final_loss"] > 0 and record["device"] == "cpu"
    assert record["ragen_lit"]["version"]
    before, after = record["validation"]["before"], record["validation"]["after"]
    assert after["format_ok_rate"] >= before["format_ok_rate"]

    # the folder is what `fit` loads for model.name=hf model.path=<out>, and SFT moved it towards the expert
    cfg = load_config(CONF, [*overrides, "model.name=hf", f"model.path={out}"])
    assert resolve_model_path(cfg.model) == str(out)
    assert next(load_policy(str(out), "auto").parameters()).dtype == torch.float32
    source = record["source_model"]
    assert expert_loss(str(out), overrides) < expert_loss(source, overrides)


def run_bad(capsys, *argv: str) -> str:
    code = main(["warm-start", "--config", CONF, *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--steps", "0"], "--steps=0"),
        (["--episodes", "0"], "--episodes=0"),
        (["--lr", "0"], "--lr=0.0"),
        (["--batch-size", "0"], "--batch-size=0"),
        (["--epsilon", "1.5"], "--epsilon=1.5"),
        (["model.name=hf"], "model.path"),
        (["model.name=hf", "model.path=./no/such/model"], "model.path"),
        (["env.name=nothing"], "env.name"),
    ],
)
def test_bad_input_is_one_error_line_naming_the_option(tmp_path, capsys, argv, named):
    assert named in run_bad(capsys, "--out", str(tmp_path / "warm"), "trainer.accelerator=cpu", *argv)
    assert not (tmp_path / "warm").exists()


def test_an_out_folder_with_files_is_refused(tmp_path, capsys):
    (tmp_path / "kept.txt").write_text("x")
    assert "--out" in run_bad(capsys, "--out", str(tmp_path), "trainer.accelerator=cpu")
    assert [p.name for p in tmp_path.iterdir()] == ["kept.txt"]


def test_an_env_the_expert_cannot_solve_is_refused(tmp_path, capsys):
    questions = tmp_path / "questions.jsonl"
    questions.write_text('{"question": "What is the colour of a blue sky?", "answer": "blue"}\n')
    err = run_bad(
        capsys,
        "--out",
        str(tmp_path / "warm"),
        "--episodes",
        "4",
        "trainer.accelerator=cpu",
        "env.name=mathqa",
        f"env.options={{path: {questions}}}",
    )
    assert "env.name=mathqa" in err and "expert" in err
    assert not (tmp_path / "warm").exists()


def test_the_continue_command_swaps_the_model_and_keeps_the_other_overrides():
    command = continue_command("conf/x.yaml", ["model=smollm2-135m", "env.options.size=5", "model.path=a"], "/r/w")
    assert command == "python -m ragen_lit fit --config conf/x.yaml env.options.size=5 model.name=hf model.path=/r/w"
    assert continue_command(None, ["env.options={p: 0.8}"], "/r w").endswith(
        "'env.options={p: 0.8}' model.name=hf 'model.path=/r w'"
    )
