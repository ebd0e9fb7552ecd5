"""`model.chat_template`: the Jinja chat template that replaces the tokenizer's own. `chatml` is shipped here; any
other value is the path of a Jinja file, refused in one line when it is missing or does not compile. The rollouts
apply the text `chat_template_source` returns (`presets.load_chat`) before `agent.chat.ChatFormat` reads it.
Jinja is imported only to check a file: loading a config imports no torch, transformers or Lightning."""

from __future__ import annotations

from pathlib import Path

from ragen_lit.errors import ConfigError

# Qwen's ChatML without its default system message (the rollouts always give one); prefix-preserving. The tiny
# model's tokenizer ships the same template (`presets.tiny.tokenizer.CHAT_TEMPLATE`)
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SHIPPED = {"chatml": CHATML}

KEY = "model.chat_template"
ALLOWED = "give chatml (the shipped ChatML template) or the path of a Jinja chat template file"


def chat_template_source(value: str | None) -> str | None:
    """The Jinja text `value` names (None: keep the tokenizer's own). Raises ConfigError, naming the key and the
    value, for an empty value, a path with no file, a file that cannot be read or is empty, and a template that
    does not compile as transformers compiles chat templates."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{KEY}={value!r} is empty; leave it null (the tokenizer's own template) or {ALLOWED}")
    if value in SHIPPED:
        return SHIPPED[value]
    path = Path(value).expanduser()
    if not path.is_file():
        what = "a folder, not a file" if path.is_dir() else "no such file"
        raise ConfigError(f"{KEY}={value!r}: {what}; {ALLOWED}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{KEY}={value!r}: cannot read it ({_first_line(err)})") from None
    if not text.strip():
        raise ConfigError(f"{KEY}={value!r}: the file is empty; {ALLOWED}")
    problem = jinja_problem(text)
    if problem is not None:
        raise ConfigError(f"{KEY}={value!r}: not a valid Jinja template ({problem})")
    return text


def jinja_problem(text: str) -> str | None:
    """Why `text` does not compile in an environment like the one transformers renders chat templates in (sandboxed,
    `trim_blocks`/`lstrip_blocks`, loop controls, its `{% generation %}` tag), in one line; None when it compiles."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(jinja2.ext.Extension):
        """transformers' `{% generation %}...{% endgeneration %}` (it marks the assistant's tokens): parsed as its
        body alone, which is all a compile check needs."""

        tags = {"generation"}

        def parse(self, parser):
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols]
    )
    try:
        env.from_string(text)
    except jinja2.TemplateSyntaxError as err:
        return f"line {err.lineno}: {_first_line(err)}"
    except jinja2.TemplateError as err:
        return _first_line(err)
    return None


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__
