"""Overrides the grammar refuses unquoted are answered with a quoted form that, typed into a shell, reads back as the
same text; a comma in a value of `fit` is a sweep, refused with the quoted form."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ragen_lit.config.overrides import parse_overrides, quoted_override
from ragen_lit.errors import ConfigError

# what a path or a name may hold: printable text with quotes, '=', commas, brackets and non-ASCII letters
TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=40)


@given(TEXT)
@example("'`")  # a shell expands ` and $ inside double quotes
@example("it's $HOME")
def test_a_quoted_override_reads_back_as_the_same_text(value):
    word = quoted_override("env.options.path", value)
    if word is None:  # only a value the grammar cannot quote: one ending in a backslash
        assert value.endswith("\\")
        return
    (typed,) = shlex.split(word)  # what the shell hands the program
    (override,) = parse_overrides([typed])
    assert override.key_or_group == "env.options.path" and override.value() == value


@pytest.mark.parametrize(
    ("word", "quoted"),
    [
        (
            "trainer.resume=/runs/a/checkpoints/iter-epoch=0003.ckpt",
            """'trainer.resume="/runs/a/checkpoints/iter-epoch=0003.ckpt"'""",
        ),
        ("logging.output_dir=/data/été", """'logging.output_dir="/data/été"'"""),
        ("logging.run_name=it's", '''"logging.run_name=\\"it's\\""'''),
        ("model.path=~/models/x", """'model.path="~/models/x"'"""),
    ],
)
def test_a_refused_value_is_answered_with_its_quoted_form(word, quoted):
    with pytest.raises(ConfigError) as refused:
        parse_overrides([word])
    message = str(refused.value)
    assert message.startswith(word.split("=")[0] + ": the value ") and message.endswith(f"pass it as {quoted}")


def test_a_broken_list_is_not_answered_with_quotes():
    with pytest.raises(ConfigError, match=r"is not an override .*; overrides look like key.sub=value"):
        parse_overrides(["model.lora.target_modules=[q_proj, v_proj"])


def test_a_comma_is_a_sweep_for_sweep_only():
    assert [o.is_sweep_override() for o in parse_overrides(["filter.value=0.5,0.9"], sweeps=True)] == [True]
    with pytest.raises(ConfigError, match="""quote a value that holds a comma \\('filter.value="0.5,0.9"'\\)"""):
        parse_overrides(["filter.value=0.5,0.9"])
