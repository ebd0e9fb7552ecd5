import re
import shutil
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer
from transformers import PreTrainedTokenizerFast

from ragen_lit.agent.chat import ChatFormat
from ragen_lit.agent.prompts import THINK_OPEN
from ragen_lit.config import ConfigError, ModelConfig
from ragen_lit.config.chat_templates import chat_template_source
from ragen_lit.presets import load_chat
from ragen_lit.presets.tiny.tokenizer import CHAT_TEMPLATE, train_tokenizer

# chat templates rendered by the installed transformers; CI also runs these at the lowest declared versions
pytestmark = pytest.mark.floors


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(["hello world system user assistant"] * 10, vocab_size=300)


def test_pieces_reassemble_the_template_render(tokenizer):
    chat = ChatFormat(tokenizer)
    first = chat.first_prompt_ids("S", "U1")
    convo = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U1"},
        {"role": "assistant", "content": "<think>A"},
        {"role": "user", "content": "U2"},
    ]
    rendered = tokenizer.apply_chat_template(convo, tokenize=False, add_generation_prompt=True)
    pieces = tokenizer.decode(first) + "A" + chat.assistant_close + tokenizer.decode(chat.next_turn_ids("U2"))
    assert pieces == rendered + "<think>"


def test_a_batch_of_messages_encodes_as_each_one_does(tokenizer):
    """A rollout turn encodes all its messages in one tokenizer call: the same ids as one call per message."""
    chat = ChatFormat(tokenizer)
    users = ["hello world", "", "user  assistant <think> hello", "x" * 50]
    expected = [chat.encode(chat._user_before + u + chat._user_after + "<think>") for u in users]
    assert chat.next_turns_ids(users) == expected
    assert [chat.next_turn_ids(u) for u in users] == expected
    pairs = [("S", "U1"), ("system hello", ""), ("S", "U1")]  # a group's episodes share their first prompt
    rendered = [
        tokenizer.apply_chat_template(
            [{"role": "system", "content": a}, {"role": "user", "content": b}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for a, b in pairs
    ]
    assert chat.first_prompts_ids(pairs) == [chat.encode(text + "<think>") for text in rendered]
    assert chat.encode_many([]) == []


def test_repeated_messages_are_encoded_once_into_lists_of_their_own(tokenizer):
    """A group's episodes in one state send the same message: it is encoded once, each text still gets its ids
    (the same as alone) in a list of its own."""
    chat = ChatFormat(tokenizer)
    calls = []

    class Counting:
        def __call__(self, texts, **kwargs):
            calls.append(list(texts))
            return tokenizer(texts, **kwargs)

        def __getattr__(self, name):
            return getattr(tokenizer, name)

    chat.tokenizer = Counting()
    texts = ["b a", "a", "b a", "a", "c"]
    ids = chat.encode_many(texts)
    assert calls == [["b a", "a", "c"]]
    assert ids == [chat.encode(text) for text in texts]
    assert ids[0] is not ids[2]


def test_close_ids_skip_what_the_model_already_sampled(tokenizer):
    chat = ChatFormat(tokenizer)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert chat.close_ids([5, 6]) == chat.assistant_close_ids
    assert chat.close_ids([5, im_end]) == chat.assistant_close_ids[1:]


def test_history_rewriting_template_is_refused(tokenizer):
    bad = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, eos_token="<|im_end|>")
    bad.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}"
        "{{'<|im_start|>assistant\n<|im_end|>\n'}}"
        "{% else %}{{'<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n'}}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{'<|im_start|>assistant\n'}}{% endif %}"
    )
    with pytest.raises(ValueError, match="rewrites earlier turns"):
        ChatFormat(bad)
    bad.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        ChatFormat(bad)


# --- chat templates of real model families, written out by hand from their published Jinja (no download) -------
TEMPLATES = Path(__file__).parent / "chat_templates"

# Qwen2.5-Instruct: ChatML, with a default system message when none is given
QWEN25 = (TEMPLATES / "qwen2.5-instruct.jinja").read_text()
# Qwen3: ChatML whose assistant turns before the last user query lose their <think> block, and whose last assistant
# turn gets its reasoning re-wrapped as `<think>\n...\n</think>\n\n`
QWEN3 = (TEMPLATES / "qwen3.jinja").read_text()
# Llama-3.1-Instruct: header tokens, the knowledge-cutoff lines in the system turn, every content trimmed
LLAMA31 = (TEMPLATES / "llama-3.1-instruct.jinja").read_text()
# Llama-3-Instruct (3.0): the same turns without the system preamble
LLAMA3 = (TEMPLATES / "llama-3-instruct.jinja").read_text()
LLAMA_SPECIALS = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>")


def family_tokenizer(base, template: str, eos: str, bos: str | None = None) -> PreTrainedTokenizerFast:
    """`base`'s byte-level BPE (`<|im_start|>`, `<|im_end|>`, `<|endoftext|>` special; `<think>`, `</think>`,
    `<answer>`, `</answer>` atomic) plus Llama-3's header tokens, with a model family's chat template."""
    backend = Tokenizer.from_str(base.backend_tokenizer.to_str())
    backend.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in LLAMA_SPECIALS])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=eos, bos_token=bos, pad_token="<|endoftext|>", chat_template=template
    )


SYSTEM = "You are a helpful assistant. system"
USERS = ["hello world", "world user", "user hello"]
# what the policy samples after the `<think>` each prompt ends with
REPLIES = [
    "hello</think><answer>up</answer>",
    "world world</think><answer>left</answer>",
    "x</think><answer>a</answer>",
]


def token_in_token_out(chat: ChatFormat, stop_id: int | None) -> list[int]:
    """A 3-turn episode's ids as the rollout builds them: first prompt, each turn's sampled ids (ending with the
    stop token the engine stopped on, where `stop_id` is given), the close ids left to append, the next user turn."""
    ids = chat.first_prompt_ids(SYSTEM, USERS[0])
    for turn, reply in enumerate(REPLIES):
        sampled = chat.encode(reply) + ([stop_id] if stop_id is not None else [])
        ids += sampled + chat.close_ids(sampled)
        if turn + 1 < len(USERS):
            ids += chat.next_turn_ids(USERS[turn + 1])
    return ids


def rendered_ids(tokenizer) -> list[int]:
    """The template's rendering of the whole 3-turn conversation, tokenized in one piece; each assistant turn is the
    `<think>` of its prompt plus what was sampled."""
    messages = [{"role": "system", "content": SYSTEM}]
    for user, reply in zip(USERS, REPLIES):
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": THINK_OPEN + reply}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    return tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize(
    ("template", "eos", "bos"),
    [
        (QWEN25, "<|im_end|>", None),
        (LLAMA31, "<|eot_id|>", "<|begin_of_text|>"),
        (LLAMA3, "<|eot_id|>", "<|begin_of_text|>"),
    ],
    ids=["qwen2.5", "llama-3.1", "llama-3"],
)
def test_real_families_render_token_in_token_out_over_three_turns(tokenizer, template, eos, bos):
    family = family_tokenizer(tokenizer, template, eos, bos)
    chat = ChatFormat(family)
    assert chat.assistant_close == {"<|im_end|>": "<|im_end|>\n", "<|eot_id|>": "<|eot_id|>"}[eos]
    expected = rendered_ids(family)
    assert token_in_token_out(chat, None) == expected  # the close appended whole
    assert token_in_token_out(chat, family.eos_token_id) == expected  # the engine stopped on the close's first token
    if bos:
        assert expected[0] == family.convert_tokens_to_ids(bos)


def test_qwen25_gives_its_default_system_message_when_none_is_given(tokenizer):
    """The template is Qwen2.5's as published; the rollouts always give a system message, so its default never
    shows in their prompts."""
    family = family_tokenizer(tokenizer, QWEN25, "<|im_end|>")
    text = family.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    first = ChatFormat(family).first_prompt_ids("S", "hi")
    assert (
        family.decode(first)
        == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>"
    )


def test_qwen3_is_refused_in_one_line_naming_the_override(tokenizer):
    qwen3 = family_tokenizer(tokenizer, QWEN3, "<|im_end|>")
    history = [
        {"role": "user", "content": "U1"},
        {"role": "assistant", "content": "<think>R1</think>A1"},
        {"role": "user", "content": "U2"},
    ]
    # the template as published: an earlier turn's reasoning is gone from the history the model is shown
    assert "R1" not in qwen3.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
    with pytest.raises(ValueError) as err:
        ChatFormat(qwen3)
    message = str(err.value)
    assert "\n" not in message
    assert "is not prefix-preserving" in message
    assert message.endswith("set model.chat_template=chatml or model.chat_template=<path to a Jinja template>")


def test_qwen3_with_the_shipped_chatml_renders_token_in_token_out(tokenizer):
    qwen3 = family_tokenizer(tokenizer, QWEN3, "<|im_end|>")
    qwen3.chat_template = chat_template_source("chatml")
    chat = ChatFormat(qwen3)
    assert token_in_token_out(chat, qwen3.eos_token_id) == rendered_ids(qwen3)
    assert token_in_token_out(chat, None) == rendered_ids(qwen3)


def test_the_shipped_chatml_is_the_tiny_models_template():
    assert chat_template_source("chatml") == CHAT_TEMPLATE


def test_load_chat_applies_model_chat_template_and_refuses_qwen3_in_one_config_error(tokenizer, tmp_path):
    """`presets.load_chat`, where `fit` and `warm-start` get their tokenizer: the override replaces the saved
    template (chatml, or a Jinja file), and a refusal is a ConfigError (one line, no traceback in the CLI)."""
    folder = tmp_path / "qwen3"
    family_tokenizer(tokenizer, QWEN3, "<|im_end|>").save_pretrained(folder)
    with pytest.raises(ConfigError) as err:
        load_chat(ModelConfig(name="hf", path=str(folder)), str(folder))
    assert str(err.value).startswith(f"the chat template of {str(folder)!r} is not prefix-preserving")
    assert str(err.value).endswith("model.chat_template=<path to a Jinja template>")
    loaded, chat = load_chat(ModelConfig(name="hf", path=str(folder), chat_template="chatml"), str(folder))
    assert loaded.chat_template == chat_template_source("chatml")
    assert token_in_token_out(chat, loaded.eos_token_id) == rendered_ids(loaded)
    jinja = tmp_path / "qwen25.jinja"
    jinja.write_text(QWEN25)
    loaded, chat = load_chat(ModelConfig(name="hf", path=str(folder), chat_template=str(jinja)), str(folder))
    assert loaded.chat_template == QWEN25
    assert token_in_token_out(chat, None) == rendered_ids(loaded)
    # an override that is itself refused names the key it came from
    bad = tmp_path / "qwen3.jinja"
    bad.write_text(QWEN3)
    with pytest.raises(ConfigError, match=rf"^model\.chat_template='{re.escape(str(bad))}': the chat template of "):
        load_chat(ModelConfig(name="hf", path=str(folder), chat_template=str(bad)), str(folder))


def test_fit_refuses_a_history_rewriting_template_in_one_line(tmp_path, capsys):
    """`python -m ragen_lit fit` on a model folder with Qwen3's template: exit 2 and one line, no traceback."""
    from ragen_lit.cli import main
    from ragen_lit.presets.tiny import shipped_folder

    folder = tmp_path / "model"
    shutil.copytree(shipped_folder(), folder)
    (folder / "chat_template.jinja").write_text(QWEN3)
    args = ["fit", "model=hf", f"model.path={folder}", f"logging.output_dir={tmp_path / 'runs'}"]
    assert main([*args, "trainer.accelerator=cpu", "validation.num_envs=0"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"error: the chat template of {str(folder)!r} is not prefix-preserving (an assistant turn does not extend the "
        "generation prompt with its text as written: the template adds, drops or changes text around it, e.g. its "
        "<think> block); token-in/token-out rollouts need one that is: set model.chat_template=chatml or "
        "model.chat_template=<path to a Jinja template>"
    ]


def test_evaluate_applies_model_chat_template_to_a_model_folder(tmp_path):
    """`evaluate --model FOLDER` builds its chat like `fit`: Qwen3's template refused, `chatml` in its place taken."""
    import torch

    from ragen_lit.config import load_config
    from ragen_lit.evaluation.policy import load_evaluated_policy
    from ragen_lit.presets.tiny import shipped_folder

    folder = tmp_path / "model"
    shutil.copytree(shipped_folder(), folder)
    (folder / "chat_template.jinja").write_text(QWEN3)
    overrides = ["model=hf", f"model.path={folder}", "trainer.accelerator=cpu", "model.compile=false"]
    refused = load_config(None, overrides)
    with pytest.raises(ConfigError, match="rewrites earlier turns|not prefix-preserving"):
        load_evaluated_policy(str(folder), refused.model, refused.trainer.accelerator, torch.device("cpu"))
    cfg = load_config(None, [*overrides, "model.chat_template=chatml"])
    evaluated = load_evaluated_policy(str(folder), cfg.model, cfg.trainer.accelerator, torch.device("cpu"))
    assert evaluated.chat.assistant_close == "<|im_end|>\n"
