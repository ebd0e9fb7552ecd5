import pytest
from transformers import PreTrainedTokenizerFast

from ragen_lit.agent.chat import ChatFormat
from ragen_lit.presets.tiny.tokenizer import train_tokenizer

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
