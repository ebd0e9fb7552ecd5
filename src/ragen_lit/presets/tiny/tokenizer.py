"""The tiny model's tokenizer: a byte-level BPE trained offline on environment text, with ChatML.

Byte-level means any text round-trips (unknown characters fall back to their UTF-8 bytes), so the
vocabulary only has to be good, not complete. Two choices keep the model's sequences short and its
copying easy:

* no GPT-2 word regex: merges may cross spaces, so the boilerplate every turn repeats (system
  instruction, "Always output: …") collapses into a few long tokens;
* every digit is its own pre-token, so a coordinate such as `(1, 2)` always puts the same digit ids
  in the observation and in the reasoning that copies it.

`<|endoftext|>`, `<|im_start|>`, `<|im_end|>` are special tokens; the response tags `<think>`,
`</think>`, `<answer>`, `</answer>` are atomic (single ids, never merged with their neighbours) but not
special, so decoding with `skip_special_tokens=True` keeps them. The ChatML template is Qwen's:
`<|im_start|>{role}\\n{content}<|im_end|>\\n`, generation prompt `<|im_start|>assistant\\n`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from ragen_lit.agent.prompts import ANSWER_CLOSE, ANSWER_OPEN, THINK_CLOSE, THINK_OPEN

END_OF_TEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (END_OF_TEXT, IM_START, IM_END)
TAG_TOKENS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Training text is cut at the atomic tokens so that no merge learns a piece of them.
_ATOMIC = re.compile("|".join(re.escape(token) for token in SPECIAL_TOKENS + TAG_TOKENS))


def _byte_level_bpe(vocab: dict[str, int] | None = None, merges: list[tuple[str, str]] | None = None) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\(\d+, \d+\)|\d"), behavior="isolated"),
            pre_tokenizers.Split(Regex(r"[.;!?\n]"), behavior="merged_with_previous"),
            pre_tokenizers.Split(Regex(r" ?\|\| ?"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _wrap(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    """Register the atomic tokens and wrap as a transformers tokenizer with the ChatML template."""
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS])
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in TAG_TOKENS])
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    return wrapped


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """The untrained tokenizer: one id per byte plus the atomic tokens (used to render the training
    corpus through the real chat template before any merge exists)."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: index for index, symbol in enumerate(sorted(alphabet))}
    return _wrap(_byte_level_bpe(vocab, []))


def train_tokenizer(corpus: Iterable[str], vocab_size: int = 1536) -> PreTrainedTokenizerFast:
    """A byte-level BPE with `vocab_size` entries (bytes + merges + special tokens; the four tags come
    on top) trained on `corpus`, wrapped with the ChatML template. Deterministic for a given corpus."""
    if not isinstance(vocab_size, int) or vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(
            f"vocab_size must be an int >= {256 + len(SPECIAL_TOKENS)} (bytes + special tokens), got {vocab_size!r}"
        )
    tokenizer = _byte_level_bpe()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    pieces = (piece for text in corpus for piece in _ATOMIC.split(text) if piece)
    tokenizer.train_from_iterator(pieces, trainer=trainer)
    return _wrap(tokenizer)
