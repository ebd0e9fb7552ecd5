"""The rows of a graph-cache call, kept for the next call: a rollout's next turn prefills only its new tokens.

A turn's prompt is, token for token, the previous turn's prompt, its sampled tokens and the new message (the rollout
appends ids, nothing is re-tokenized). With `HFEngine(reuse_turns=True)` the engine keeps its decode slot and each
row's prompt, generation and mask after a call; a call whose every prompt continues a kept row copies those rows'
cached positions and prefills only what is new (`HFEngine._prefill_kept`). The kept keys and values come from decode
steps, so the logits equal a full prefill's up to rounding.
"""

from __future__ import annotations

import torch

# `KeptRows`: the trailing tokens of a kept row's prompt and generation that key its lookup
_KEY_TOKENS = 8


class KeptRows:
    """A graph-cache call's rows, kept for the next call (`reuse_turns`): the slot holding their keys and values
    (columns `[0, W)` the prompt, masked by `prompt_mask [B, W]`; then one column per decode step run, `fed`), and
    each row's prompt and generation. Row b's cache holds its prompt and its first `min(len(generation), fed)`
    sampled tokens, at positions `positions[b]` onward for the sampled ones."""

    def __init__(self, slot, prompts, generations, prompt_mask: torch.Tensor, positions: torch.Tensor, fed: int):
        self.slot, self.prompts, self.generations = slot, prompts, generations
        self.prompt_mask, self.positions, self.fed = prompt_mask, positions, fed
        # rows by (prompt + generation length, its last tokens): a short key, checked in full on a hit; the last
        # tokens come from the two lists' tails, not from a copy of the whole prompt and generation
        self._index: dict[tuple[int, tuple[int, ...]], list[int]] = {}
        for row, (prompt, generation) in enumerate(zip(prompts, generations)):
            tail = (prompt[-_KEY_TOKENS:] + generation[-_KEY_TOKENS:])[-_KEY_TOKENS:]
            self._index.setdefault((len(prompt) + len(generation), tuple(tail)), []).append(row)
        self._lengths = sorted({length for length, _ in self._index})

    def reused(self, row: int) -> int:
        """How many leading tokens of a prompt continuing `row` its cache holds."""
        return len(self.prompts[row]) + min(len(self.generations[row]), self.fed)

    def continued(self, prompts: list[list[int]]) -> list[int] | None:
        """For each prompt, a kept row whose prompt and generation it starts with and continues by at least one
        token; None unless every prompt has one (then the call prefills as usual)."""
        rows = []
        for prompt in prompts:
            row = next(
                (
                    row
                    for length in self._lengths
                    if length < len(prompt)
                    for row in self._index.get((length, tuple(prompt[max(0, length - _KEY_TOKENS) : length])), ())
                    if prompt[: len(self.prompts[row])] == self.prompts[row]
                    and prompt[len(self.prompts[row]) : length] == self.generations[row]
                ),
                None,
            )
            if row is None:
                return None
            rows.append(row)
        return rows
