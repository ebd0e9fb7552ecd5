"""MathQA: answer a math word problem (docs/METHOD.md §6, MathQA; the reference's MetaMathQA env).

Questions come from a JSONL, JSON-array or parquet file (`path`), by default the bundled synthetic set
`ragen_lit/envs/data/mathqa_synthetic.jsonl` (made by `scripts/make_mathqa_data.py`). Two record formats
(`format`, `auto` tells them by their fields):
- `qa`: `question` and `answer` (the bundled set's);
- `metamathqa`: MetaMathQA's (meta-math/MetaMathQA on the HF hub: `query`, `response`, `type`,
  `original_question`): the question is `query`, the gold answer what follows the last "The answer is:" of
  `response`.
The instance of seed s is question `s % len(data)`. An answer is correct when it equals the gold answer
after `normalize_answer`. With `max_attempts` > 1 a wrong answer may be retried and a correct one earns 1,
0.5, 0.25, ... by attempt, as in the reference.
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragen_lit.envs.base import CHARSET, OptionError, TextEnv, check_int
from ragen_lit.envs.records import existing_file, read_known_records

# format -> the fields its records need (and which one holds the question, which the answer)
FORMATS = {"qa": ("question", "answer"), "metamathqa": ("query", "response")}
ANSWER_MARK = "The answer is:"  # MetaMathQA's responses end with "The answer is: <answer>"
DECIMAL = re.compile(r"-?\d+\.\d+")


def normalize_answer(text: Any) -> str:
    """Answer text in a canonical form: no whitespace, lower case, no `$` or thousands commas, no
    trailing period, no trailing zeros after a decimal point (`$1,250.00.` -> `1250`)."""
    text = "".join(str(text).split()).lower().replace(",", "").replace("$", "").rstrip(".")
    if DECIMAL.fullmatch(text):
        text = text.rstrip("0").rstrip(".")
    return text


def default_data_path() -> Path:
    return Path(str(importlib.resources.files("ragen_lit.envs").joinpath("data", "mathqa_synthetic.jsonl")))


@dataclass(frozen=True)
class QuestionSet:
    """A loaded data set and what its observation space needs (computed once per file)."""

    pairs: tuple[tuple[str, str], ...]  # (question, gold answer)
    charset: frozenset[str]
    max_question_length: int


def load_questions(path: str | Path | None = None, format: str = "auto") -> QuestionSet:
    """The questions of a data file (default: the bundled set) in `format` (`auto`: told by the fields);
    cached per file, modification time and format, so the many envs of a rollout share one copy."""
    file = default_data_path() if path is None else existing_file(path)
    if format != "auto" and format not in FORMATS:
        raise OptionError("format", format, f"one of auto, {', '.join(FORMATS)}")
    return _load_cached(str(file.resolve()), file.stat().st_mtime_ns, format)


@functools.lru_cache(maxsize=8)
def _load_cached(file: str, mtime_ns: int, format: str) -> QuestionSet:
    records, chosen = read_known_records(file, FORMATS, format, "question")
    pairs = []
    for index, record in enumerate(records):
        if chosen == "metamathqa":
            question, response = str(record["query"]).strip(), str(record["response"])
            if ANSWER_MARK not in response:
                raise OptionError(
                    "path", file, f"MetaMathQA responses ending in '{ANSWER_MARK} <answer>' (record {index} has none)"
                )
            answer = response.rsplit(ANSWER_MARK, 1)[1].strip()
        else:
            question, answer = str(record["question"]).strip(), str(record["answer"]).strip()
        if not question or not answer:
            raise OptionError("path", file, f"non-empty questions and answers (record {index} has an empty one)")
        pairs.append((question, answer))
    questions = [question for question, _ in pairs]
    return QuestionSet(tuple(pairs), CHARSET | frozenset("".join(questions)), max(map(len, questions)))


class MathQAEnv(TextEnv):
    """Math word problems. Public state: `question`, `gold_answer`, `questions` (the data set)."""

    instruction = (
        "You are solving math word problems. Answer with the final number only, without units or "
        "explanation, for example 42."
    )
    actions = None

    def __init__(
        self, path: str | None = None, max_attempts: int = 1, format: str = "auto", render_mode: str | None = None
    ) -> None:
        question_set = load_questions(path, format)
        self.questions = question_set.pairs
        self.path, self.format = path, format
        self.question, self.gold_answer = self.questions[0]
        self._solved = False
        super().__init__(
            max_actions_per_episode=check_int("max_attempts", max_attempts, 1),
            observation_max_length=question_set.max_question_length,
            observation_charset=question_set.charset,
            render_mode=render_mode,
        )

    @property
    def max_attempts(self) -> int:
        return self.max_actions_per_episode

    # ----------------------------------------------------------------------------- TextEnv hooks
    @property
    def item_count(self) -> int:
        return len(self.questions)

    def _new_episode(self, seed: int) -> None:
        self.question, self.gold_answer = self.questions[seed % len(self.questions)]
        self._solved = False

    @property
    def is_success(self) -> bool:
        return self._solved

    def _apply(self, action: str) -> tuple[float, bool]:
        attempt = self.num_actions  # 0-based: valid attempts before this one
        self._solved = normalize_answer(action) == normalize_answer(self.gold_answer)
        reward = 0.5**attempt if self._solved else 0.0
        return reward, self._solved or attempt + 1 >= self.max_attempts

    def _observation(self) -> str:
        return self.question
