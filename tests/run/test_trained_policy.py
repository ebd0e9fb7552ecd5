"""A trained run as a model: `export` writes a transformers folder that `from_pretrained` loads with the trained
policy's logits, `diagnose --model` takes a run folder or a checkpoint, `fit model.path=<export>` trains from it,
and bad input ends with one line and writes nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from ragen_lit.cli import fit, main
from ragen_lit.config import load_config
from ragen_lit.run.checkpoints import find_checkpoint
from ragen_lit.run.trained_policy import EXPORT_INFO

ROOT = Path(__file__).resolve().parents[2]
SMALL = [
    "rollout.groups=2",
    "rollout.group_size=4",
    "rollout.max_turns=2",
    "rollout.max_new_tokens=48",
    "validation.num_envs=0",
    "diagnostics.every_n_iterations=0",
    "optim.num_minibatches=1",
    "optim.micro_batch_size=4",
    "filter.strategy=none",
    "trainer.threads=1",
]


def _fit(output_dir: Path, model_path: str, *extra: str) -> dict:
    cfg = load_config(
        str(ROOT / "conf" / "frozenlake.yaml"),
        [f"model.path={model_path}", f"logging.output_dir={output_dir}", *SMALL, *extra],
    )
    return fit(cfg)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_model_dir) -> Path:
    """A 2-iteration run of the tiny model with a checkpoint after each iteration and its rollouts saved."""
    out = tmp_path_factory.mktemp("runs")
    _fit(out, str(tiny_model_dir), "trainer.iterations=2", "trainer.checkpoint_every=1", "logging.save_rollouts=true")
    (run,) = out.glob("frozenlake-*")
    return run


def _policy_of(checkpoint: Path) -> dict[str, torch.Tensor]:
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    return {k.removeprefix("policy."): v for k, v in state.items() if k.startswith("policy.")}


def _trained_model(base: Path, checkpoint: Path):
    """The policy as training holds it: the base model with the checkpoint's weights, built independently."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model.load_state_dict(_policy_of(checkpoint), strict=False)
    return model.eval()


def _logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits


def _export(source, out) -> tuple[int, str]:
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["export", str(source), "--out", str(out)])
    return code, err.getvalue()


@pytest.mark.slow
def test_export_writes_a_folder_from_pretrained_loads_with_the_trained_logits(run_dir, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "exported"
    assert _export(run_dir, out)[0] == 0
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json", EXPORT_INFO} <= names
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no staging folder left
    info = json.loads((out / EXPORT_INFO).read_text())
    last = run_dir / "checkpoints" / "last.ckpt"
    assert info["checkpoint"] == str(last) and info["base_model"] == str(tiny_model_dir) and info["epoch"] == 1

    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    base_tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert tokenizer.chat_template == base_tokenizer.chat_template
    messages = [{"role": "user", "content": "go left"}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ids == base_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    trained = _logits(_trained_model(tiny_model_dir, last), ids)
    assert torch.equal(_logits(exported, ids), trained)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    assert not torch.equal(_logits(base, ids), trained)  # the run did train


def test_a_checkpoint_file_and_the_run_folder_rule(run_dir, tiny_model_dir, tmp_path):
    """RUN as a .ckpt exports that checkpoint; a run folder stands for its newest checkpoint (`run.checkpoints`)."""
    from transformers import AutoModelForCausalLM

    first = run_dir / "checkpoints" / "iter-0001.ckpt"
    assert _export(first, tmp_path / "first")[0] == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "first").eval()
    ids = list(range(5, 25))
    assert torch.equal(_logits(exported, ids), _logits(_trained_model(tiny_model_dir, first), ids))

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    assert find_checkpoint(copy, "RUN") == (copy / "checkpoints" / "last.ckpt").resolve()
    (copy / "checkpoints" / "last.ckpt").unlink()
    assert find_checkpoint(copy, "RUN") == (copy / "checkpoints" / "iter-0002.ckpt").resolve()


def test_a_sharded_checkpoint_folder_is_exported(run_dir, tiny_model_dir, tmp_path):
    """An FSDP run's checkpoint (a distributed-checkpoint folder with meta.pt, as Lightning writes it), here written
    in one process from the single-file checkpoint's state."""
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("*.ckpt"))
    single = run_dir / "checkpoints" / "last.ckpt"
    content = torch.load(single, map_location="cpu", weights_only=True)
    sharded = copy / "checkpoints" / "last.ckpt"
    dcp.save({"state_dict": content["state_dict"]}, checkpoint_id=sharded)
    torch.save({"epoch": content["epoch"], "global_step": content["global_step"]}, sharded / "meta.pt")
    assert _export(copy, tmp_path / "out")[0] == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    ids = list(range(5, 25))
    assert torch.equal(_logits(exported, ids), _logits(_trained_model(tiny_model_dir, single), ids))


def test_diagnose_takes_a_run_folder_or_a_checkpoint(run_dir, tmp_path, capsys):
    """`--model RUN` and `--model RUN/checkpoints/last.ckpt` score with the trained policy: the same report as
    `--model <its export>`."""
    rollouts = str(next((run_dir / "rollouts").glob("*.jsonl")))
    assert _export(run_dir, tmp_path / "exported")[0] == 0
    reports = []
    for model in (run_dir, run_dir / "checkpoints" / "last.ckpt", tmp_path / "exported"):
        capsys.readouterr()
        assert main(["diagnose", "--model", str(model), "--rollouts", rollouts, "--device", "cpu"]) == 0
        out = capsys.readouterr().out
        assert "retrieval_acc" in out
        reports.append(out.split("rollouts ", 1)[1])  # the model line differs
    assert reports[0] == reports[1] == reports[2]


@pytest.mark.slow
def test_fit_starts_from_an_exported_policy(run_dir, tmp_path):
    exported = tmp_path / "exported"
    assert _export(run_dir, exported)[0] == 0
    summary = _fit(tmp_path / "runs", str(exported), "trainer.iterations=1")
    assert summary["iterations"] == 1
    (run,) = (tmp_path / "runs").glob("frozenlake-*")
    assert json.loads((run / "run.json").read_text())["config"]["model"]["path"] == str(exported)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "no such run folder or checkpoint file"),
        ("no_checkpoints", "no checkpoints in"),
        ("not_a_checkpoint", "not a checkpoint torch can read"),
        ("not_ours", "holds no policy weights"),
        ("no_run_json", "no run.json in"),
        ("out_not_empty", "already exists and is not an empty folder"),
        ("out_under_a_file", "cannot create a folder there"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(case, message, run_dir, tmp_path):
    source, out = run_dir, tmp_path / "out"
    if case == "missing":
        source = tmp_path / "no_such_run"
    elif case == "no_checkpoints":
        source = tmp_path / "run"
        (source / "checkpoints").mkdir(parents=True)
        (source / "run.json").write_text((run_dir / "run.json").read_text())
    elif case == "not_a_checkpoint":
        source = tmp_path / "notes.ckpt"
        source.write_text("not a checkpoint\n")
    elif case == "not_ours":
        source = tmp_path / "other.ckpt"
        torch.save({"weights": torch.zeros(2)}, source)
    elif case == "no_run_json":
        source = tmp_path / "loose.ckpt"
        shutil.copy(run_dir / "checkpoints" / "last.ckpt", source)
    elif case == "out_not_empty":
        out.mkdir()
        (out / "keep.txt").write_text("mine")
    elif case == "out_under_a_file":
        (tmp_path / "file").write_text("")
        out = tmp_path / "file" / "out"
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    code, err = _export(source, out)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err and "Traceback" not in err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    if case in ("not_a_checkpoint", "not_ours", "no_run_json"):  # diagnose says the same for --model
        rollouts = tmp_path / "r.jsonl"
        rollouts.write_text(json.dumps({"prompt": "p", "reasoning": "r", "group": 0}) + "\n")
        code, diag_err = _diagnose(source, rollouts)
        assert code == 2 and message in diag_err and diag_err.count("\n") == 1


def _diagnose(model, rollouts) -> tuple[int, str]:
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["diagnose", "--model", str(model), "--rollouts", str(rollouts), "--device", "cpu"])
    return code, err.getvalue()
