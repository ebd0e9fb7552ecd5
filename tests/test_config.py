import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from ragen_lit.cli import main
from ragen_lit.config import (
    AlgoConfig,
    Config,
    ConfigError,
    EnvConfig,
    LoggingConfig,
    ModelConfig,
    Sections,
    TrainerConfig,
    load_config,
    render_yaml,
)
from ragen_lit.config.typed_fields import field_docs
from ragen_lit.envs import ENV_CLASSES

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
        ("algo.max_sampling_rounds=0", "algo.max_sampling_rounds=0 is out of range; it must be >= 1"),
        ("algo.overlong_cache_fraction=1.5", "algo.overlong_cache_fraction=1.5 is out of range; it must be <= 1.0"),
        ("algo.overlong_cache_fraction=-0.1", "algo.overlong_cache_fraction=-0.1 is out of range; it must be >= 0.0"),
        ("algo.dynamic_sampling=maybe", "algo.dynamic_sampling"),
        ("optim.pad_to_multiple=-1", "optim.pad_to_multiple=-1 is out of range; it must be >= 0"),
        (
            "logging.loggers=[mlflow,tb]",
            "logging.loggers=['mlflow', 'tb']: 'tb' is not allowed; choose from: mlflow, tensorboard, csv, wandb",
        ),
        ("logging.loggers=[mlflow,csv,csv]", "logging.loggers=['mlflow', 'csv', 'csv'] names csv twice"),
        (
            "logging.loggers=[wandb]",
            "logging.loggers=['wandb'] leaves out mlflow, the run's record (run.json names its MLflow run; resume and "
            "compare read it); keep it in the list: logging.loggers=[mlflow,wandb]",
        ),
        ("logging.loggers=[]", "logging.loggers=[] leaves out mlflow"),
        (
            "logging.loggers=mlflow",
            "logging.loggers='mlflow' is not a list; give one in brackets, e.g. logging.loggers=[mlflow]",
        ),
        ("optim.betas=0.9", "optim.betas=0.9 is not a list; give one in brackets, e.g. optim.betas=[0.9]"),
        ("logging.loggers=null", "logging.loggers: field 'logging.loggers' is not Optional"),
        ("logging.wandb_mode=on", "logging.wandb_mode='on' is not allowed; choose one of: offline, online"),
    ],
)
def test_bad_overrides_name_key_value_and_allowed(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@dataclasses.dataclass(frozen=True)
class _Bundle(Sections):
    algo: AlgoConfig
    trainer: TrainerConfig


def test_a_sections_bundle_holds_the_configs_own_sections_and_no_other():
    cfg = load_config(None, ["algo=grpo"])
    bundle = _Bundle.of(cfg)
    assert bundle.algo is cfg.algo and bundle.trainer is cfg.trainer  # the same objects: an override shows in both
    assert not hasattr(bundle, "model")
    with pytest.raises(dataclasses.FrozenInstanceError):
        bundle.algo = AlgoConfig()


def test_loggers_default_to_mlflow_and_take_the_others_in_any_order():
    assert load_config(None).logging.loggers == ["mlflow"]
    assert Config().logging.loggers is not Config().logging.loggers  # a list default is each config's own
    chosen = load_config(None, ["logging.loggers=[csv,mlflow,wandb,tensorboard]"]).logging.loggers
    assert chosen == ["csv", "mlflow", "wandb", "tensorboard"]


def test_a_yaml_logger_that_is_not_a_list_names_the_key(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("logging:\n  loggers: wandb\n")
    with pytest.raises(ConfigError, match=r"^logging.loggers='wandb' is not a list; give one in brackets"):
        load_config(str(path))


def test_padding_to_a_multiple_and_packing_without_padding_are_refused_together():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["optim.padding_free=true", "optim.pad_to_multiple=64"])
    assert "optim.pad_to_multiple=64" in str(err.value) and "optim.padding_free=true" in str(err.value)
    assert load_config(None, ["optim.pad_to_multiple=64"]).optim.pad_to_multiple == 64
    assert load_config(None, ["optim.padding_free=true"]).optim.pad_to_multiple == 0  # auto stays legal


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


def _comment_words(text: str) -> list[str]:
    """The words of every comment in a rendered config, in order (a field's comment after its `  # `, a comment
    line after its `# `)."""
    words = []
    for line in text.splitlines():
        code, mark, comment = line.partition("  # ")
        if not mark and code.lstrip().startswith("#"):
            comment = code.lstrip()[1:]
        words += comment.split()
    return words


def _docs_in_order(obj) -> list[str]:
    """The words of every field's doc of a config (section) in rendering order."""
    docs = field_docs(type(obj))
    words = []
    for f in dataclasses.fields(obj):
        words += docs[f.name].split()
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            words += _docs_in_order(value)
    return words


@pytest.mark.parametrize(
    "overrides",
    [[], ["env.options={path: /data/search_qa/natural_questions_open_dev.jsonl, top_k: 3}"]],
    ids=["defaults", "a long value"],
)
def test_render_yaml_wraps_every_comment_at_120_columns_and_loses_no_word(tmp_path, overrides):
    """Long docs (and a long header line) are wrapped, not cut: no line over 120 characters, every word of the
    header and of every doc still there in order, and the YAML loads to the same config. After a long value
    the comment goes above its field."""
    cfg = load_config(None, overrides)
    header = "# " + " ".join(f"word{i}" for i in range(60))
    text = render_yaml(cfg, header)
    assert max(len(line) for line in text.splitlines()) <= 120
    assert any(line.startswith(" " * 10) and line.lstrip().startswith("# ") for line in text.splitlines())
    sections = [getattr(cfg, f.name) for f in dataclasses.fields(Config)]
    assert _comment_words(text) == header[2:].split() + [w for section in sections for w in _docs_in_order(section)]
    path = tmp_path / "x.yaml"
    path.write_text(text)
    assert load_config(str(path)) == cfg
    if overrides:
        lines = text.splitlines()
        options = next(i for i, line in enumerate(lines) if line.startswith("  options: "))
        assert "#" not in lines[options] and lines[options - 1].startswith("  # constructor options")


@pytest.mark.parametrize("path", sorted((ROOT / "conf").rglob("*.yaml")), ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_configs_have_no_line_over_120_characters(path):
    too_long = [i for i, line in enumerate(path.read_text().splitlines(), 1) if len(line) > 120]
    assert not too_long, f"{path.name}: lines {too_long} are over 120 characters (run scripts/make_configs.py)"


@pytest.mark.parametrize("path", sorted((ROOT / "conf").rglob("*.yaml")), ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_configs_load_show_every_field_and_start_with_their_command(path):
    cfg = load_config(str(path))
    text = path.read_text()
    assert text.splitlines()[0] == f"# python -m ragen_lit fit --config {path.relative_to(ROOT)}"
    for section in dataclasses.fields(Config):
        for f in dataclasses.fields(getattr(cfg, section.name)):
            assert f"  {f.name}: " in text, f"{path.name} lacks {section.name}.{f.name}"
    # every field has its comment: beside it, or (after a long value) on the line above
    lines = text.splitlines()
    fields = [i for i, line in enumerate(lines) if line.startswith("  ") and not line.lstrip().startswith("#")]
    assert all("  # " in lines[i] or lines[i - 1].lstrip().startswith("# ") for i in fields)


def test_cli_reports_one_line_without_traceback():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ragen_lit",
            "fit",
            "--config",
            str(ROOT / "conf" / "frozenlake.yaml"),
            "filter.value=1.5",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: filter.value=1.5 is out of range for filter.strategy=top_p; it must be in (0, 1] (0 keeps no group)"
    ]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["filter.level=trajectory", "filter.strategy=min_p", "filter.value=0.5"],
            "filter.strategy='min_p' does not apply at filter.level=trajectory, which keeps the top and bottom "
            "filter.value share of each group's rollouts; leave filter.strategy=top_p (the default) or use "
            "filter.level=group",
        ),
        (
            ["filter.level=trajectory", "filter.value=0"],
            "filter.value=0.0 is out of range for filter.level=trajectory; it must be in (0, 1] (the share of "
            "each group's rollouts kept; 0 keeps none)",
        ),
    ],
)
def test_trajectory_level_refuses_a_group_strategy_and_a_zero_share(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert str(err.value) == message
    assert load_config(None, ["filter.level=trajectory", "filter.value=0.5"]).filter.level == "trajectory"


def test_dynamic_sampling_refuses_groups_of_one_rollout():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["algo=ppo", "algo.dynamic_sampling=true", "rollout.group_size=1"])
    assert str(err.value) == (
        "algo.dynamic_sampling=true with rollout.group_size=1: a group of one rollout never has reward variance, "
        "so no round could fill the batch; use rollout.group_size >= 2"
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "rollout.vllm_args.dtype=float16",
            "rollout.vllm_args.dtype is set by the vLLM engine itself: set rollout.dtype",
        ),
        (
            "rollout.vllm_args.logprobs_mode=raw_logprobs",
            "rollout.vllm_args.logprobs_mode is set by the vLLM engine itself: the rollout's log-probs must be those "
            "of the processed logits the trainer scores",
        ),
        ("rollout.vllm_args={1: true}", "rollout.vllm_args: 1 is not a vllm.LLM argument name"),
    ],
)
def test_vllm_args_refuse_what_the_engine_sets_itself(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert str(err.value) == message


def test_vllm_args_take_dotted_keys_and_mappings():
    dotted = load_config(None, ["rollout.vllm_args.enforce_eager=true", "rollout.vllm_args.max_num_seqs=64"])
    assert dotted.rollout.vllm_args == {"enforce_eager": True, "max_num_seqs": 64}
    mapping = load_config(None, ["rollout.vllm_args={kv_cache_memory_bytes: 1073741824}"])
    assert mapping.rollout.vllm_args == {"kv_cache_memory_bytes": 1 << 30}
    assert load_config(None, []).rollout.vllm_args == {}


@pytest.mark.parametrize("algo", ["grpo", "drgrpo", "dapo", "gigpo"])
def test_group_relative_advantages_refuse_groups_of_one_rollout(algo):
    """GRPO at 128 prompts x 1 rollout trained on the entropy bonus alone: on FrozenLake the tiny model's entropy
    rose from 0.3 to 7 nats and its success fell from 31% to 0 in 8 iterations (docs/REPRODUCTION.md (e))."""
    with pytest.raises(ConfigError, match=r"rollout.group_size=1: a group-relative advantage .* every advantage is 0"):
        load_config(None, [f"algo={algo}", "rollout.group_size=1"])
    assert load_config(None, ["algo=ppo", "rollout.group_size=1"]).rollout.group_size == 1  # a critic's baseline
    assert load_config(None, [f"algo={algo}", "rollout.group_size=2"]).rollout.group_size == 2


@pytest.mark.parametrize("command", ["config", "fit"])
def test_config_and_fit_refuse_a_bad_env_alike(command, capsys):
    """`config` used to print a config with an unknown env and exit 0 while `fit` refused it."""
    assert main([command, "env.name=nonsense", "logging.output_dir=/nonexistent/never-written"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    allowed = ", ".join(sorted(ENV_CLASSES))
    assert err.splitlines() == [f"error: env.name='nonsense' is not a known environment; allowed: {allowed}"]


def _warnings(caplog) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.levelname == "WARNING" and r.name.startswith("ragen_lit.config")
    ]


def test_deprecated_every_n_steps_maps_to_every_n_iterations_with_one_warning(tmp_path, caplog):
    cfg = load_config(None, ["diagnostics.every_n_steps=3"])
    assert cfg.diagnostics.every_n_iterations == 3
    path = tmp_path / "old.yaml"
    path.write_text("diagnostics:\n  every_n_steps: 2\n")
    assert load_config(str(path)).diagnostics.every_n_iterations == 2
    # the old key in the file and on the command line: the override wins, still one warning per load
    assert load_config(str(path), ["diagnostics.every_n_steps=4"]).diagnostics.every_n_iterations == 4
    # an old file with a new override is not a conflict: the override wins
    assert load_config(str(path), ["diagnostics.every_n_iterations=7"]).diagnostics.every_n_iterations == 7
    messages = _warnings(caplog)
    assert len(messages) == 4
    assert all("\n" not in m and "diagnostics.every_n_iterations" in m for m in messages)


def test_giving_both_names_of_a_renamed_key_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(None, ["diagnostics.every_n_steps=3", "diagnostics.every_n_iterations=2"])
    assert "diagnostics.every_n_steps and diagnostics.every_n_iterations are both given" in str(err.value)
    path = tmp_path / "both.yaml"
    path.write_text("diagnostics:\n  every_n_steps: 3\n  every_n_iterations: 2\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    assert str(err.value).startswith(f"--config {path}: diagnostics.every_n_steps and")
    assert "\n" not in str(err.value)


def test_every_field_has_a_docstring():
    from ragen_lit.config.typed_fields import field_docs

    for section in dataclasses.fields(Config):
        cls = type(getattr(Config(), section.name))
        assert list(field_docs(cls)) == [f.name for f in dataclasses.fields(cls)], cls.__name__


def test_choice_lists_have_one_source():
    """The config and the rooms that implement each name read the same tuple from `choices`."""
    from ragen_lit import algos, choices, engines, filtering, models
    from ragen_lit.config import AlgoConfig, FilterConfig, RolloutConfig
    from ragen_lit.models.gqa_attention import MASKED_ATTENTION

    def field_choices(cls, name):
        return next(f for f in dataclasses.fields(cls) if f.name == name).metadata["choices"]

    assert field_choices(FilterConfig, "strategy") is filtering.STRATEGIES is choices.STRATEGIES
    assert field_choices(FilterConfig, "score") is filtering.SCORES is choices.SCORES
    assert field_choices(FilterConfig, "advantage_scaling") is algos.KEEP_RATE_SCALINGS is choices.KEEP_RATE_SCALINGS
    assert field_choices(AlgoConfig, "advantage") is algos.ADVANTAGE_ESTIMATORS is choices.ADVANTAGE_ESTIMATORS
    assert field_choices(AlgoConfig, "loss_agg") is algos.LOSS_AGG_MODES is choices.LOSS_AGG_MODES
    assert field_choices(AlgoConfig, "kl_estimator") is algos.KL_ESTIMATORS is choices.KL_ESTIMATORS
    assert field_choices(AlgoConfig, "name") == tuple(algos.PRESETS)
    assert field_choices(RolloutConfig, "engine") is engines.ENGINES is choices.ENGINES
    assert field_choices(RolloutConfig, "hf_cache") is engines.HF_CACHE_MODES is choices.HF_CACHE_MODES
    assert field_choices(ModelConfig, "attention") is choices.ATTENTION_IMPLEMENTATIONS
    assert set(field_choices(ModelConfig, "dtype")) == {"auto", *models.DTYPES}
    assert tuple(MASKED_ATTENTION) == choices.MASKED_ATTENTION_KERNELS
    logging_fields = {f.name: f.metadata for f in dataclasses.fields(LoggingConfig)}
    assert logging_fields["loggers"]["items"] is choices.LOGGERS
    assert logging_fields["wandb_mode"]["choices"] is choices.WANDB_MODES


def test_env_name_doc_lists_every_registered_env():
    from ragen_lit.config.typed_fields import field_docs
    from ragen_lit.envs import ENV_CLASSES

    doc = field_docs(EnvConfig)["name"]
    assert sorted(doc.removeprefix("environment: ").split(" | ")) == sorted(ENV_CLASSES)


def test_gigpo_needs_an_env_with_anchor_states():
    for env in ("frozenlake", "sokoban"):
        cfg = load_config(None, ["algo=gigpo", f"env.name={env}"])
        assert cfg.algo.advantage == "gigpo" and cfg.algo.turn_level_rewards
    for env in ("countdown", "mathqa"):
        with pytest.raises(ConfigError) as err:
            load_config(None, [f"env.name={env}", "algo=grpo", "algo.advantage=gigpo"])
        message = str(err.value)
        assert "\n" not in message
        assert message.startswith(f"algo.advantage=gigpo needs anchor states, and env.name={env} has no state_key")
        assert "frozenlake" in message and "sokoban" in message
    with pytest.raises(ConfigError, match="algo.gigpo_gamma"):
        load_config(None, ["algo=gigpo", "algo.gigpo_gamma=1.5"])
    with pytest.raises(ConfigError, match="algo.gigpo_step_weight"):
        load_config(None, ["algo=gigpo", "algo.gigpo_step_weight=-1"])


def test_a_saved_config_with_a_retired_key_still_loads(tmp_path, caplog):
    saved = tmp_path / "run.yaml"
    saved.write_text("model:\n  sdpa_cudnn: false\noptim:\n  micro_batch_size: 4\n")
    cfg = load_config(saved)
    assert cfg.optim.micro_batch_size == 4
    assert "model.sdpa_cudnn is ignored" in caplog.text


def test_an_override_of_a_retired_key_is_refused_in_one_line():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["rollout.hf_decode_attention=split"])
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("rollout.hf_decode_attention='split': this setting was removed")
    assert "rollout.exact" in message


def test_model_chat_template_takes_chatml_or_a_jinja_file(tmp_path):
    assert load_config(None, []).model.chat_template is None  # the tokenizer's own
    assert load_config(None, ["model.chat_template=chatml"]).model.chat_template == "chatml"
    template = tmp_path / "template.jinja"
    # transformers' own tags compile too: loop controls and `{% generation %}`
    template.write_text(
        "{% for m in messages %}{% generation %}{{ m['content'] }}{% endgeneration %}{% if loop.last %}{% break %}"
        "{% endif %}{% endfor %}"
    )
    assert load_config(None, [f"model.chat_template={template}"]).model.chat_template == str(template)


def test_model_chat_template_refuses_a_missing_or_broken_file_in_one_line(tmp_path, capsys):
    allowed = "give chatml (the shipped ChatML template) or the path of a Jinja chat template file"
    missing = tmp_path / "nope.jinja"
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m['content'] }}\n")
    empty = tmp_path / "empty.jinja"
    empty.write_text("\n")
    cases = {
        str(missing): f"no such file; {allowed}",
        str(tmp_path): f"a folder, not a file; {allowed}",
        str(empty): f"the file is empty; {allowed}",
        str(broken): "not a valid Jinja template (line 1: Unexpected end of template. Jinja was looking for the "
        "following tags: 'endfor' or 'else'. The innermost block that needs to be closed is 'for'.)",
    }
    for value, why in cases.items():
        with pytest.raises(ConfigError) as err:
            load_config(None, [f"model.chat_template={value}"])
        assert str(err.value) == f"model.chat_template={value!r}: {why}"
    with pytest.raises(ConfigError) as err:
        load_config(None, ["model.chat_template="])
    assert (
        str(err.value) == f"model.chat_template='' is empty; leave it null (the tokenizer's own template) or {allowed}"
    )
    assert main(["fit", f"model.chat_template={missing}", f"logging.output_dir={tmp_path / 'runs'}"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: model.chat_template={str(missing)!r}: no such file; {allowed}"
    ]
    assert not (tmp_path / "runs").exists()
