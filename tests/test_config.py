import subprocess
import sys
from pathlib import Path

import pytest

from ragen_lit.config import Config, ConfigError, load_config, render_yaml

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "override, message",
    [
        ("filter.value=1.5", "filter.value=1.5 is out of range"),
        ("filter.valu=0.5", "filter.valu: unknown key; keys of filter are: strategy"),
        ("rollout.groups=abc", "rollout.groups"),
        ("rollout.groups=0", "rollout.groups=0 is out of range; it must be >= 1"),
        ("algo=foo", "algo='foo' is not a preset; choose one of: ppo, dapo, grpo, drgrpo"),
        ("foo.bar=1", "unknown section 'foo'"),
        ("rollout.groups", "overrides look like key.sub=value"),
        ("filter.strategy=topp", "filter.strategy='topp' is not allowed; choose one of: none, top_p"),
        ("optim.actor_lr=-1", "optim.actor_lr=-1.0 is out of range; it must be > 0.0"),
        ("model=hf", "model.name=hf needs model.path"),
        ("rollout.temperature=nan", "rollout.temperature=nan must be a finite number"),
        ("diagnostics.max_tokens_per_forward=10", "diagnostics.max_tokens_per_forward=10 must be 0 (auto) or >= 64"),
        ("rollout.hf_cache=paged", "rollout.hf_cache='paged' is not allowed; choose one of: auto, dynamic"),
    ],
)
def test_bad_overrides_name_key_value_and_allowed(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_presets_set_section_and_fields_override_after():
    cfg = load_config(None, ["algo=grpo", "algo.clip_high=0.3"])
    assert cfg.algo.name == "grpo" and cfg.algo.advantage == "grpo" and cfg.algo.loss_agg == "seq-mean-token-mean"
    assert cfg.algo.clip_high == 0.3
    dr = load_config(None, ["algo=drgrpo"])
    assert dr.algo.advantage == "drgrpo" and dr.algo.loss_agg == "seq-mean-token-sum-norm"


def test_yaml_preset_and_cli_preset_replace_the_yaml_section(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("algo:\n  name: ppo\n  advantage: gae\n  clip_low: 0.1\nrollout:\n  groups: 4\n")
    cfg = load_config(str(path), ["algo=grpo"])
    assert cfg.algo.advantage == "grpo" and cfg.algo.clip_low == 0.2 and cfg.rollout.groups == 4
    assert load_config(str(path)).algo.clip_low == 0.1


def test_missing_or_broken_yaml(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(str(bad))


def test_render_yaml_round_trips_every_field(tmp_path):
    cfg = load_config(None, ["rollout.groups=3", "env.options={size: 5}"])
    text = render_yaml(cfg, "# header")
    path = tmp_path / "x.yaml"
    path.write_text(text)
    assert load_config(str(path)) == cfg


@pytest.mark.parametrize("path", sorted((ROOT / "conf").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_load_show_every_field_and_start_with_their_command(path):
    cfg = load_config(str(path))
    text = path.read_text()
    assert text.splitlines()[0] == f"# python -m ragen_lit fit --config conf/{path.name}"
    import dataclasses

    for section in dataclasses.fields(Config):
        for f in dataclasses.fields(getattr(cfg, section.name)):
            assert f"  {f.name}: " in text, f"{path.name} lacks {section.name}.{f.name}"
    assert all("#" in line for line in text.splitlines() if line.startswith("  "))


def test_cli_reports_one_line_without_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "ragen_lit", "fit", "--config", str(ROOT / "conf" / "frozenlake.yaml"), "filter.value=1.5"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == ["error: filter.value=1.5 is out of range for strategy top_p; it must be in [0, 1]"]
