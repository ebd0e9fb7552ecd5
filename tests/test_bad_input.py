"""Bad configurations end `fit` with exit code 2 and one `error:` line naming the key, before any model loads and
before anything is written (the output folder and the MLflow store are checked too): sizes this machine or the model
cannot hold, values the override grammar needs quoted (the line shows the quoted form), merge errors (the line names
the key), run folders outside `logging.output_dir`."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest
import torch

from ragen_lit.cli import main

CONF = str(Path(__file__).resolve().parents[1] / "conf" / "frozenlake.yaml")


def _unwritable(out: Path, make_unwritable) -> Path:
    out.mkdir()
    make_unwritable(out)
    return out


def _under_a_file(out: Path, make_unwritable) -> Path:
    out.write_text("a file where the output folder's parent should be")
    return out / "runs"


def _corrupt_store(out: Path, make_unwritable) -> Path:
    out.mkdir()
    (out / "mlruns.db").write_bytes(b"not an sqlite database " * 64)
    return out


def _store_is_a_folder(out: Path, make_unwritable) -> Path:
    (out / "mlruns.db").mkdir(parents=True)
    return out


# (YAML text or None for conf/frozenlake.yaml, overrides, what the line must name with {out} the output folder
# [, a layout that prepares `out` and returns the logging.output_dir to pass])
CASES = {
    "malformed yaml": ("trainer:\n  seed: [1,\n", [], "not valid YAML"),
    "duplicate yaml key": ("trainer:\n  seed: 1\n  seed: 2\n", [], "duplicate key seed"),
    "unknown yaml section": ("trainer:\n  seed: 1\nbogus:\n  x: 1\n", [], "'bogus'; sections are: model, env"),
    "yaml section as a scalar": ("trainer: 5\n", [], "section trainer is 5"),
    "precision": (None, ["trainer.precision=bogus"], "trainer.precision='bogus'"),
    "gpu memory share": (None, ["trainer.gpu_memory_fraction=1.5"], "trainer.gpu_memory_fraction=1.5 is out of range"),
    "gpu without cuda": (None, ["trainer.accelerator=gpu"], "trainer.accelerator=gpu"),
    "tracking uri scheme": (None, ["logging.tracking_uri=bogus://x"], "logging.tracking_uri='bogus://x'"),
    "tracking server scheme": (
        None,
        ["logging.tracking_server=ftp://x", "logging.tracking_uri=sqlite:///x.db"],
        "logging.tracking_server='ftp://x' is not an MLflow server's address",
    ),
    "tracking server without its store": (
        None,
        ["logging.tracking_server=http://127.0.0.1:9"],
        "writes to the store logging.tracking_uri names, and logging.tracking_uri is not set",
    ),
    "tracking server that does not answer": (
        None,
        ["logging.tracking_server=http://127.0.0.1:9", "logging.tracking_uri=sqlite:///x.db"],
        "logging.tracking_server='http://127.0.0.1:9': the MLflow server does not answer",
    ),
    "empty experiment": (None, ["logging.experiment="], "logging.experiment=''"),
    "unknown logger": (None, ["logging.loggers=[mlflow,neptune]"], "'neptune' is not allowed; choose from: mlflow"),
    "loggers without mlflow": (None, ["logging.loggers=[tensorboard]"], "leaves out mlflow, the run's record"),
    "yaml loggers not a list": ("logging:\n  loggers: csv\n", [], "logging.loggers='csv' is not a list"),
    "missing critic folder": (None, ["model.critic_path=/no/such/folder"], "model.critic_path='/no/such/folder'"),
    "vllm not installed": (None, ["rollout.engine=vllm"], "rollout.engine=vllm needs the vllm extra"),
    "context too short": (None, ["rollout.max_context_tokens=16"], "rollout.max_context_tokens=16"),
    "trajectory share zero": (None, ["filter.level=trajectory", "filter.value=0"], "filter.value=0.0 is out of range"),
    "lora rank negative": (None, ["model.lora.r=-1"], "model.lora.r=-1 is out of range; it must be >= 0"),
    "lora dropout one": (None, ["model.lora.dropout=1"], "model.lora.dropout=1"),
    "lora unknown key": (None, ["model.lora.rank=8"], "model.lora.rank: unknown key; keys of model.lora are: r, alpha"),
    "lora under fsdp": (None, ["model.lora.r=8", "trainer.strategy=fsdp"], "model.lora.r=8 with trainer.strategy=fsdp"),
    "output folder unwritable": (None, [], "cannot write in {out} (Permission denied)", _unwritable),
    "output folder under a file": (None, [], "{out} is a file, not a folder", _under_a_file),
    "corrupt mlflow store": (None, [], "store {out}/mlruns.db is not a readable sqlite database", _corrupt_store),
    "mlflow store is a folder": (None, [], "store {out}/mlruns.db is a folder, not an sqlite file", _store_is_a_folder),
    # sizes: the worst case the config allows against this machine's memory and cores, and the model's shape
    "groups no machine holds": (
        None,
        ["rollout.groups=1000000000"],
        "rollout.groups=1000000000 x rollout.group_size=8 = 8000000000 episodes of up to rollout.max_context_tokens",
    ),
    "group size no machine holds": (
        None,
        ["rollout.group_size=100000000"],
        "not one group fits: at most rollout.group_size=",
    ),
    "validation episodes no machine holds": (
        None,
        ["validation.num_envs=1000000000"],
        "validation.num_envs=1000000000",
    ),
    "answer longer than the context": (
        None,
        ["rollout.max_new_tokens=1000000000"],
        "rollout.max_new_tokens=1000000000 must be below rollout.max_context_tokens=2048",
    ),
    "context beyond the model's window": (
        None,
        ["rollout.max_context_tokens=1000000000", "rollout.max_new_tokens=100"],
        "rollout.max_context_tokens=1000000000 exceeds the model's context window (max_position_embeddings=2048",
    ),
    "scorer forward no machine holds": (
        None,
        ["diagnostics.max_tokens_per_forward=1000000000000"],
        "diagnostics.max_tokens_per_forward=1000000000000 tokens hold",
    ),
    "lora rank beyond the model's width": (
        None,
        ["model.lora.r=100000"],
        "model.lora.r=100000 exceeds the model's width",
    ),
    "map no context holds": (
        None,
        ["env.options.size=3000"],
        "env.options.size=3000, env.options.success_rate=1.0: env.name=frozenlake then shows observations of up to",
    ),
    "more threads than cores": (None, ["trainer.threads=1000000"], "trainer.threads=1000000: this machine has"),
    "more devices than the machine has": (
        None,
        ["trainer.devices=1000000"],
        "trainer.devices=1000000: this machine has",
    ),
    "seed beyond numpy's": (None, ["trainer.seed=4294967296"], "trainer.seed=4294967296 is out of range"),
    "negative env seed": (None, ["rollout.seed=-1"], "rollout.seed=-1 is out of range; it must be >= 0"),
    # a filter that keeps nothing
    "top_p keeps nothing": (None, ["filter.value=0"], "filter.value=0.0 is out of range for filter.strategy=top_p"),
    "top_k keeps nothing": (
        None,
        ["filter.strategy=top_k", "filter.value=0"],
        "filter.value=0.0 is out of range for filter.strategy=top_k",
    ),
    # where a run writes
    "run name outside the output folder": (None, ["logging.run_name=../../x"], "logging.run_name='../../x' must be"),
    "empty output folder": (None, ["logging.output_dir="], "logging.output_dir='' is empty"),
    "missing checkpoint to resume": (None, ["trainer.resume=/no/such.ckpt"], "trainer.resume='/no/such.ckpt': no such"),
    "nothing to resume": (None, ["trainer.resume=last"], "trainer.resume=last: no run named"),
    # values the override grammar takes quoted only: the line shows the quoted form
    "non-ASCII value": (
        None,
        ["env.options.path=données.jsonl"],
        """env.options.path: the value 'données.jsonl' needs quotes in an override (unquoted it may hold only ASCII \
letters, digits, spaces and _ / \\ - + . : $ % * @ ? |); pass it as 'env.options.path="données.jsonl"'""",
    ),
    "quote in a value": (None, ["logging.run_name=it's"], """pass it as "logging.run_name=\\"it's\\""" ""),
    "equals sign in a value": (
        None,
        ["trainer.resume=/x/iter-epoch=0001.ckpt"],
        """pass it as 'trainer.resume="/x/iter-epoch=0001.ckpt"'""",
    ),
    "home folder with a space": (None, ["model.path=~/my models"], """pass it as 'model.path="~/my models"'"""),
    "comma in a value of fit": (
        None,
        ["logging.run_name=a,b"],
        """logging.run_name=a,b: a comma (or choice, range, glob) gives several values, a sweep of runs, and this \
command takes one value; quote a value that holds a comma ('logging.run_name="a,b"')""",
    ),
    # merge errors name their key
    "section given a value": (None, ["env=countdown"], "env='countdown': env is a section, not a value or a preset"),
    "list onto a mapping": (None, ["env.options=[1,2]"], "env.options: Cannot merge DictConfig with ListConfig"),
    "yaml list onto a mapping": (
        "env:\n  options: [1, 2]\n",
        [],
        "env.options: Cannot merge DictConfig with ListConfig",
    ),
}


def _tree(folder: Path) -> dict[str, bytes | None]:
    """Every path under `folder` with its bytes (None for a folder)."""
    return {str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes() for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_config_stops_with_one_line_and_writes_nothing(case, tmp_path, monkeypatch, capsys, make_unwritable):
    if case == "gpu without cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    if case == "vllm not installed" and importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed")
    text, overrides, names, *layout = CASES[case]
    cwd, out = tmp_path / "cwd", tmp_path / "out"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # an MLflow store or mlruns/ folder made in the current folder would show here
    config = CONF
    if text is not None:
        config = str(tmp_path / "bad.yaml")
        Path(config).write_text(text)
    output_dir = layout[0](out, make_unwritable) if layout else out
    before = _tree(tmp_path)
    started = time.perf_counter()
    code = main(["fit", "--config", config, f"logging.output_dir={output_dir}", *overrides])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and names.format(out=out) in lines[0], err
    assert "Traceback" not in err
    assert _tree(tmp_path) == before
    assert time.perf_counter() - started < 30  # a broken store fails at once, not after MLflow's retries


@pytest.mark.parametrize("command", ["fit", "warm-start", "config", "sweep", "compare", "diagnose", "export"])
def test_every_command_prints_its_help(command, capsys):
    """`--help` of each subcommand prints and exits 0 (a `%` in a help text once broke warm-start's)."""
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    assert "usage: " in capsys.readouterr().out


def test_a_config_path_that_is_a_folder_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["fit", "--config", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --config {tmp_path}: a folder, not a YAML file (e.g. conf/frozenlake.yaml)\n"
    assert list(tmp_path.iterdir()) == []


def test_a_generation_batch_the_memory_cannot_hold_names_the_batch_size(tmp_path, monkeypatch, capsys):
    """On a machine with 100 MiB available, 128 episodes fit on the host (16 MiB) but a batch of 128 sequences of
    2048 tokens holds 128 MiB of the tiny model's keys and values in float32 (1 MiB each): at most 100 fit."""
    from ragen_lit.run import bounds

    monkeypatch.setattr(bounds, "available_memory", lambda: 100 * 1024**2)
    small = ["validation.num_envs=64", "rollout.max_batch_size=512"]
    code = main(["fit", "--config", CONF, f"logging.output_dir={tmp_path / 'out'}", *small])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert (
        "rollout.max_batch_size=512: a generation batch of 128 sequences of up to rollout.max_context_tokens=2048"
        in err
    )
    assert "holds 0.125 GiB of keys and values (float32)" in err and "at most rollout.max_batch_size=100 fits" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("logger, packages", [("tensorboard", ("tensorboard", "tensorboardX")), ("wandb", ("wandb",))])
@pytest.mark.parametrize("command", ["fit", "config"])
def test_a_logger_whose_package_is_missing_is_one_line_naming_its_extra(
    logger, packages, command, tmp_path, monkeypatch, capsys
):
    """Checked before any model loads or folder is made, and by `config` too (a printed config is one `fit` takes)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in packages else real(name, *a))
    monkeypatch.chdir(tmp_path)
    code = main(
        [command, "--config", CONF, f"logging.output_dir={tmp_path / 'out'}", f"logging.loggers=[mlflow,{logger}]"]
    )
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err == (
        f"error: logging.loggers=['mlflow', '{logger}']: {logger} is not installed here; "
        f"pip install 'ragen_lit[{logger}]'\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_wandb_online_without_a_login_is_one_line_before_any_work(tmp_path, monkeypatch, capsys):
    """No API key here (an empty home, no WANDB_API_KEY, no terminal to ask on): refused before any model loads."""
    import wandb

    wandb.teardown()  # a login earlier in this process would still count
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    out = tmp_path / "out"
    online = ["logging.loggers=[mlflow,wandb]", "logging.wandb_mode=online", f"logging.output_dir={out}"]
    assert main(["fit", "--config", CONF, *online]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: logging.wandb_mode=online: ") and err.count("\n") == 1, err
    assert "wandb login" in err and "logging.wandb_mode=offline" in err
    assert not out.exists()


def test_a_malformed_wandb_key_is_one_line_before_any_work(tmp_path, monkeypatch, capsys):
    """WANDB_API_KEY that is not a W&B key (too short): W&B's own check of its form refuses it, in one line, before
    any model loads or anything is written (it raised a traceback from the check before)."""
    import wandb

    wandb.teardown()  # a login earlier in this process would still count
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_API_KEY", "not-a-key")
    out = tmp_path / "out"
    online = ["logging.loggers=[mlflow,wandb]", "logging.wandb_mode=online", f"logging.output_dir={out}"]
    assert main(["fit", "--config", CONF, *online]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: logging.wandb_mode=online: WANDB_API_KEY invalid: ") and err.count("\n") == 1, err
    assert "logging.wandb_mode=offline" in err
    assert not out.exists()


def test_wandb_online_with_a_key_passes_the_check(tmp_path, monkeypatch):
    """A configured key is enough: the check does not ask the server (no network here)."""
    from ragen_lit.config import load_config
    from ragen_lit.run.preflight import check_wandb_login

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    import wandb

    check_wandb_login(load_config(CONF, ["logging.loggers=[mlflow,wandb]", "logging.wandb_mode=online"]).logging)
    wandb.teardown()  # the login stays with the process otherwise
