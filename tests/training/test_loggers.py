"""`logging.loggers`: TensorBoard, CSV and W&B beside MLflow, each writing inside the run folder. A fit logs the same
metrics, the config and the summary to every one, and its figures to those that take pictures; a resumed process
writes where the run wrote before (TensorBoard purges the steps it logs again, CSV starts its next version)."""

from __future__ import annotations

import csv
import dataclasses
import json
import struct
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData
from tests.training.small_fit import CONFIG, SMALL

from ragen_lit.cli import main
from ragen_lit.config import ValidationConfig, load_config, to_dict
from ragen_lit.run.folder import Run
from ragen_lit.run.loggers import RunLogger, RunTensorBoardLogger, make_extra_loggers
from ragen_lit.training.callbacks import IterationLogger, ValidationRollouts
from ragen_lit.training.run_figures import RunFigures

ALL = "logging.loggers=[mlflow,tensorboard,csv,wandb]"


def _tensorboard(folder: Path) -> EventAccumulator:
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    return events


def _scalars(events: EventAccumulator, key: str) -> list[tuple[int, float]]:
    """(step, value) of each scalar of `key`, values rounded to TensorBoard's float32."""
    return [(event.step, round(event.value, 5)) for event in events.Scalars(key)]


def _rounded(pairs) -> list[tuple[int, float]]:
    return [(int(step), round(float(value), 5)) for step, value in pairs]


def test_a_resumed_tensorboard_run_shows_each_step_once_with_the_values_logged_last(tmp_path):
    first = RunTensorBoardLogger(tmp_path, resumed=False)
    for step in (1, 2, 3):  # killed after logging iteration 3, with its checkpoint at iteration 1
        first.log_metrics({"rollout/success": step / 10}, step)
    first.finalize("failed")
    second = RunTensorBoardLogger(tmp_path, resumed=True)
    second.save()  # Lightning opens the writer at setup, before the checkpoint says where the run resumes
    for step in (2, 3, 4):
        second.log_metrics({"rollout/success": 1 + step / 10}, step)
    second.finalize("success")
    logged = _scalars(_tensorboard(tmp_path / "tensorboard"), "rollout/success")
    assert logged == [(1, 0.1), (2, 1.2), (3, 1.3), (4, 1.4)]


def test_csv_writes_each_metric_as_it_is_logged_and_each_process_its_own_version(tmp_path):
    cfg = load_config(None, ["logging.loggers=[mlflow,csv]"])
    run = Run(tmp_path, "run", cfg.logging, cfg.trainer.iterations, cfg.trainer.checkpoint_every, to_dict(cfg))
    (first,) = make_extra_loggers(run, "run-id")
    first.log_metrics({"rollout/success": 0.5}, step=1)
    metrics = tmp_path / "csv" / "version_0" / "metrics.csv"
    assert metrics.read_text().splitlines() == ["rollout/success,step", "0.5,1"]  # on disk before any flush
    resumed = dataclasses.replace(run, resume_from=str(tmp_path / "checkpoints" / "last.ckpt"))
    (second,) = make_extra_loggers(resumed, "run-id")
    second.log_metrics({"rollout/success": 0.25}, step=2)
    assert (tmp_path / "csv" / "version_1" / "metrics.csv").read_text().splitlines()[1] == "0.25,2"
    assert metrics.read_text().splitlines()[1] == "0.5,1"


class _UnreachableStore(RunLogger):
    @property
    def experiment(self):
        raise ConnectionError("store down")


def test_figures_reach_tensorboard_as_images_and_a_logger_that_fails_only_warns(tmp_path):
    tensorboard = RunTensorBoardLogger(tmp_path, resumed=False)
    history = IterationLogger(empty_stop_steps=5)
    history.history = [{"iteration": i, "rollout/success": i / 4, "filter/kept_ratio": 0.5} for i in (1, 2)]
    validation = ValidationRollouts(ValidationConfig())
    validation.results = {0: {"val/success": 0.0}, 2: {"val/success": 0.5}}
    trainer = SimpleNamespace(
        is_global_zero=True,
        loggers=[_UnreachableStore(tracking_uri="http://127.0.0.1:9"), tensorboard],
        current_epoch=2,
    )
    with pytest.warns(UserWarning, match=r"run figure \w+\.png not logged: ConnectionError: store down") as warned:
        RunFigures(history, validation, "run").on_train_end(trainer, None)
    assert len(warned) == 2  # one per figure; the other logger took them all
    images = _tensorboard(tmp_path / "tensorboard")
    assert images.Tags()["images"] == ["figures/success", "figures/kept_ratio_rv"]
    assert [(image.step, image.width > 100) for image in images.Images("figures/success")] == [(2, True)]


def _wandb_records(path: Path):
    """The records of a W&B run file (`run-<id>.wandb`): after a 7-byte header (":W&B", magic, version), LevelDB's
    log format in 32 KiB blocks; each chunk is a 7-byte header (CRC-32 of its type and data, length, type: 1 whole,
    2 first, 3 middle, 4 last) and its data, and a block's tail too short for a header is padding."""
    from wandb.proto.wandb_internal_pb2 import Record

    data, block, header = path.read_bytes(), 32768, 7
    assert data[:4] == b":W&B"
    position, record = header, b""
    while position + header <= len(data):
        if block - position % block < header:
            position += block - position % block
            continue
        crc, length, kind = struct.unpack("<IHB", data[position : position + header])
        chunk = data[position + header : position + header + length]
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == crc
        position += header + length
        record += chunk
        if kind in (1, 4):
            parsed = Record()
            parsed.ParseFromString(record)
            yield parsed
            record = b""


def _items(items) -> dict:
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


@pytest.mark.slow
def test_a_fit_logs_the_same_metrics_the_config_and_its_figures_to_every_logger(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "offline")
    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / name.lower()))
    out = tmp_path / "runs"
    overrides = ["trainer.iterations=2", "validation.every_n_iterations=1", f"logging.output_dir={out}", ALL]
    assert main(["fit", "--config", CONFIG, *SMALL, *overrides]) == 0
    printed = capsys.readouterr().out.splitlines()
    (run_dir,) = out.glob("frozenlake-*")
    (wandb_dir,) = (run_dir / "wandb").glob("offline-run-*")
    assert printed[0].endswith(f"(logs also in tensorboard/, csv/version_0/, wandb/{wandb_dir.name}/)")
    assert printed[-3:] == [
        f"TensorBoard: tensorboard --logdir {run_dir / 'tensorboard'}",
        f"CSV: {run_dir / 'csv/version_0/metrics.csv'} (config: {run_dir / 'csv/version_0/hparams.yaml'})",
        f"W&B (offline): {wandb_dir} (upload it with: wandb sync {wandb_dir})",
    ]
    assert not any(line.startswith("wandb:") for line in printed)

    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlruns.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("ragen_lit").experiment_id])
    run_id = run.info.run_id
    keys = ("val/success", "rollout/success", "filter/kept_ratio", "summary/val_success_final")
    mlflow = {key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key)) for key in keys}
    assert [step for step, _ in mlflow["val/success"]] == [0, 1, 2]
    figures = {Path(f.path).stem for f in client.list_artifacts(run_id, "figures")}
    assert {"success", "kept_ratio_rv"} <= figures

    # TensorBoard: the scalars, the figures as images, the config in hparams.yaml and in the HParams dashboard's data
    events = _tensorboard(run_dir / "tensorboard")
    for key in keys:
        assert _scalars(events, key) == _rounded(mlflow[key]), key
    assert set(events.Tags()["images"]) == {f"figures/{name}" for name in figures}
    assert yaml.safe_load((run_dir / "tensorboard" / "hparams.yaml").read_text())["algo.name"] == "grpo"
    hparams_data = HParamsPluginData.FromString(
        events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    ).session_start_info
    assert hparams_data.hparams["algo.name"].string_value == "grpo"
    assert hparams_data.hparams["rollout.groups"].number_value == 2

    # CSV: a row per logged group of metrics, the config beside it
    hparams = yaml.safe_load((run_dir / "csv" / "version_0" / "hparams.yaml").read_text())
    assert hparams["logging.loggers"] == ["mlflow", "tensorboard", "csv", "wandb"]
    assert hparams["model.resolved_path"] == run.data.params["model.resolved_path"]
    with (run_dir / "csv" / "version_0" / "metrics.csv").open() as file:
        table = list(csv.DictReader(file))
    for key in keys:
        logged = sorted((int(row["step"]), float(row[key])) for row in table if row[key])
        assert _rounded(logged) == _rounded(mlflow[key]), key

    # W&B: the run (MLflow's id, the experiment as project), its config, its history with the figures, its summary
    records = list(_wandb_records(wandb_dir / f"run-{run_id}.wandb"))
    (started,) = [r.run for r in records if r.HasField("run")]
    assert (started.run_id, started.project, started.display_name) == (run_id, "ragen_lit", "frozenlake-grpo-top_p0.9")
    config = {k: v for r in records if r.HasField("config") for k, v in _items(r.config.update).items()}
    assert config["algo.name"] == "grpo" and config["model.resolved_path"] == run.data.params["model.resolved_path"]
    history = [_items(r.history.item) for r in records if r.HasField("history")]
    for key in keys:
        logged = sorted((row["trainer/global_step"], row[key]) for row in history if key in row)
        assert _rounded(logged) == _rounded(mlflow[key]), key
    images = {k.split("/")[1]: row[k] for row in history for k in row if k.endswith("/filenames")}
    assert set(images) == figures
    assert all((wandb_dir / "files" / name).is_file() for names in images.values() for name in names)
    assert any(r.HasField("exit") and r.exit.exit_code == 0 for r in records)
