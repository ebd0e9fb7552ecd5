"""The tiny model's byte-level BPE: round trips, atomic tags, digits, ChatML through ChatFormat."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen_lit.agent.chat import ChatFormat
from ragen_lit.agent.prompts import system_prompt, user_message
from ragen_lit.envs import ENV_CLASSES, make_env
from ragen_lit.presets.tiny.build import TinyRecipe, tokenizer_corpus
from ragen_lit.presets.tiny.tokenizer import TAG_TOKENS, byte_tokenizer, train_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(tokenizer_corpus(TinyRecipe(corpus_episodes=16)), vocab_size=600)


def env_texts() -> list[str]:
    texts = []
    for name in sorted(ENV_CLASSES):
        env = make_env(name)
        observation, _ = env.reset(seed=7)
        texts.append(system_prompt(env.instruction, env.actions, 2))
        texts.append(user_message(2, observation, 3, previous_reward=-0.1, previous_invalid=True))
    return texts


def test_trained_vocabulary_has_the_requested_size_plus_the_tags(tokenizer):
    assert len(tokenizer) == 600 + len(TAG_TOKENS)


def test_env_text_round_trips_and_is_compressed(tokenizer):
    for text in env_texts():
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text
        assert len(ids) < 0.75 * len(text.encode("utf-8"))


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=80))
def test_any_text_round_trips(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_tags_and_chat_tokens_are_single_ids_even_next_to_text(tokenizer):
    for token in TAG_TOKENS + ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1
    ids = tokenizer.encode("Up leads to (0, 1).</think><answer>Up</answer>", add_special_tokens=False)
    for tag in ("</think>", "<answer>", "</answer>"):
        assert tokenizer.convert_tokens_to_ids(tag) in ids
    assert ids[-1] == tokenizer.convert_tokens_to_ids("</answer>")


def test_tags_survive_skipping_special_tokens(tokenizer):
    ids = tokenizer.encode("<|im_start|>x</think><answer>Up</answer><|im_end|>", add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "x</think><answer>Up</answer>"


def test_special_token_roles(tokenizer):
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.pad_token_id != tokenizer.eos_token_id


def test_chat_template_is_chatml(tokenizer):
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("make", [byte_tokenizer, None])
def test_chat_format_accepts_it(tokenizer, make):
    tok = make() if make else tokenizer
    chat = ChatFormat(tok)
    assert chat.assistant_close_ids == tok.encode("<|im_end|>\n", add_special_tokens=False)
    assert chat.think_open_ids == [tok.convert_tokens_to_ids("<think>")]
    first = chat.first_prompt_ids("S", "U")
    assert first[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert first[-1] == tok.convert_tokens_to_ids("<think>")


def test_byte_tokenizer_has_one_id_per_byte():
    tok = byte_tokenizer()
    assert len(tok) == 256 + 3 + len(TAG_TOKENS)
    assert len(tok.encode("héllo", add_special_tokens=False)) == len("héllo".encode())


def test_bad_vocab_size_is_refused():
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["text"], vocab_size=100)
