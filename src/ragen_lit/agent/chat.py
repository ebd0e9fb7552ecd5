"""Token-level chat framing: turn a tokenizer's chat template into the id pieces the rollout appends.

Token-in/token-out needs the conversation as a growing list of ids: the first prompt (system + user +
generation prompt + `<think>`), the closing ids of an assistant turn, and each later user message with
its generation prompt. We discover these pieces once by rendering probe conversations with the
tokenizer's chat template (its own, or the one `model.chat_template` puts in its place: `presets.load_chat`)
and checking that the template is prefix-preserving (rendering a longer conversation only appends text, and
an assistant turn, `<think>` block included, appears as written). Templates that rewrite history (e.g.
Qwen3's, which drops earlier `<think>` blocks) are refused with a one-line error that says to set
`model.chat_template`, instead of silently training on tokens the model never saw.
"""

from __future__ import annotations

from collections.abc import Sequence

from ragen_lit.agent.prompts import THINK_CLOSE, THINK_OPEN

# an assistant turn as the rollouts keep it in the history: the `<think>` the first prompt ends with, the sampled
# reasoning, `</think>`, the reply. A template that drops, moves or reformats the reasoning fails the checks below
_ASSISTANT_PROBE = THINK_OPEN + "\x00REASONING\x00" + THINK_CLOSE + "\x00ASSISTANT\x00"
_USER_PROBE = "\x00USER\x00"
# what a refusal tells the user to do (the values of the config key `model.chat_template`)
OVERRIDE = "set model.chat_template=chatml or model.chat_template=<path to a Jinja template>"


class ChatFormat:
    """Id pieces of one tokenizer's chat template, e.g. for ChatML:
    first prompt `<|im_start|>system\\n…<|im_end|>\\n<|im_start|>user\\n…<|im_end|>\\n<|im_start|>assistant\\n<think>`,
    assistant close `<|im_end|>\\n`, next turn `<|im_start|>user\\n…<|im_end|>\\n<|im_start|>assistant\\n<think>`.

    A template these pieces cannot reproduce raises ValueError: one line naming the model and what to set."""

    def __init__(self, tokenizer):
        name = getattr(tokenizer, "name_or_path", "")
        of = f" of {name!r}" if name else ""
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                f"the tokenizer{of} has no chat template; ragen_lit needs one to build multi-turn prompts: {OVERRIDE}"
            )
        self.tokenizer = tokenizer
        system = {"role": "system", "content": "S"}
        user = {"role": "user", "content": "U"}
        assistant = {"role": "assistant", "content": _ASSISTANT_PROBE}
        first = self._render([system, user], generation_prompt=True)
        closed = self._render([system, user, assistant], generation_prompt=False)
        if not closed.startswith(first) or not closed[len(first) :].startswith(_ASSISTANT_PROBE):
            raise ValueError(
                f"the chat template{of} is not prefix-preserving (an assistant turn does not extend the generation "
                "prompt with its text as written: the template adds, drops or changes text around it, e.g. its "
                f"<think> block); token-in/token-out rollouts need one that is: {OVERRIDE}"
            )
        self.assistant_close = closed[len(first) + len(_ASSISTANT_PROBE) :]
        followed = self._render([system, user, assistant, {"role": "user", "content": _USER_PROBE}], True)
        if not followed.startswith(closed) or _USER_PROBE not in followed[len(closed) :]:
            raise ValueError(
                f"the chat template{of} rewrites earlier turns (it drops or changes earlier assistant text once a "
                f"user turn follows); token-in/token-out rollouts need one that does not: {OVERRIDE}"
            )
        self._user_before, self._user_after = followed[len(closed) :].split(_USER_PROBE)
        self.assistant_close_ids = self.encode(self.assistant_close)
        self.think_open_ids = self.encode(THINK_OPEN)

    def _render(self, messages, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` of each text, in one tokenizer call instead of one per text, and each distinct text once: a
        rollout turn's messages cost the host less time while the device waits between two generations (a group's
        episodes that stand in the same state get the same message; the env-text BPE took ~0.1 ms a message on one
        CPU core). A fast tokenizer may also encode the batch in parallel threads, unless
        TOKENIZERS_PARALLELISM=false, which `python -m ragen_lit` sets by default. Each text gets its own list."""
        if not texts:
            return []
        distinct = list(dict.fromkeys(texts))
        encoded = dict(zip(distinct, self.tokenizer(distinct, add_special_tokens=False)["input_ids"]))
        return [list(encoded[text]) for text in texts]

    def first_prompt_ids(self, system: str, user: str) -> list[int]:
        """System + first user message + generation prompt + `<think>`."""
        return self.first_prompts_ids([(system, user)])[0]

    def first_prompts_ids(self, messages: Sequence[tuple[str, str]]) -> list[list[int]]:
        """`first_prompt_ids` of each (system, user) pair, encoded in one call; each distinct pair rendered once (a
        group's episodes share theirs: 128 renders of the template took ~13 ms on a CPU core)."""
        rendered = {
            (system, user): self._render(
                [{"role": "system", "content": system}, {"role": "user", "content": user}], True
            )
            + THINK_OPEN
            for system, user in dict.fromkeys(messages)
        }
        return self.encode_many([rendered[pair] for pair in messages])

    def next_turn_ids(self, user: str) -> list[int]:
        """A later user message + generation prompt + `<think>` (appended after an assistant close)."""
        return self.next_turns_ids([user])[0]

    def next_turns_ids(self, users: Sequence[str]) -> list[list[int]]:
        """`next_turn_ids` of each user message, encoded in one call."""
        return self.encode_many([self._user_before + user + self._user_after + THINK_OPEN for user in users])

    def close_ids(self, sampled: Sequence[int]) -> list[int]:
        """Ids that close an assistant turn after `sampled`: the template's closing text, minus the part
        the model already sampled itself (e.g. it emitted `<|im_end|>` as its stop token)."""
        close = self.assistant_close_ids
        for overlap in range(min(len(close), len(sampled)), 0, -1):
            if list(sampled[-overlap:]) == close[:overlap]:
                return close[overlap:]
        return list(close)
