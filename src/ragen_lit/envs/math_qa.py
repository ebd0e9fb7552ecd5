"""MathQA: answer a math word problem (ragen_reference.md §3.6, the reference's MetaMathQA env).

Questions come from a JSONL or parquet file with `question` and `answer` fields (`path`), by default
the bundled synthetic set `ragen_lit/envs/data/mathqa_synthetic.jsonl` (made by
`scripts/make_mathqa_data.py`). The instance of seed s is question `s % len(data)`. An answer is
correct when it equals the gold answer after `normalize_answer`. With `max_attempts` > 1 a wrong
answer may be retried and a correct one earns 1, 0.5, 0.25, ... by attempt, as in the reference.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragen_lit.envs.base import CHARSET, OptionError, TextEnv, check_int

FIELDS = ("question", "answer")
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


def load_questions(path: str | Path | None = None) -> QuestionSet:
    """The questions of a JSONL or parquet file (default: the bundled set); cached per file and
    modification time, so the many envs of a rollout share one copy."""
    file = default_data_path() if path is None else Path(path).expanduser()
    if not file.is_file():
        raise OptionError("path", str(file), "an existing .jsonl or .parquet file")
    return _load_cached(str(file.resolve()), file.stat().st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _load_cached(file: str, mtime_ns: int) -> QuestionSet:
    if file.endswith(".parquet"):
        records = _read_parquet(file)
    elif file.endswith((".jsonl", ".json")):
        records = []
        with open(file, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError as error:
                        raise OptionError(
                            "path", file, f"one JSON object per line (line {number}: {error.msg})"
                        ) from None
    else:
        raise OptionError("path", file, "a .jsonl or .parquet file")
    pairs = []
    for index, record in enumerate(records):
        if not isinstance(record, dict) or any(field not in record for field in FIELDS):
            keys = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise OptionError("path", file, f"records with 'question' and 'answer' fields (record {index} has {keys})")
        question, answer = str(record["question"]).strip(), str(record["answer"]).strip()
        if not question or not answer:
            raise OptionError("path", file, f"non-empty questions and answers (record {index} has an empty one)")
        pairs.append((question, answer))
    if not pairs:
        raise OptionError("path", file, "a file with at least one question")
    questions = [question for question, _ in pairs]
    return QuestionSet(tuple(pairs), CHARSET | frozenset("".join(questions)), max(map(len, questions)))


def _read_parquet(file: str) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet
    except ImportError:
        raise ImportError(f"reading the parquet file {file} needs pyarrow: pip install pyarrow") from None
    table = pyarrow.parquet.read_table(file)
    missing = [field for field in FIELDS if field not in table.column_names]
    if missing:
        raise OptionError(
            "path", file, f"columns 'question' and 'answer' (missing {missing}; has {table.column_names})"
        )
    return table.select(list(FIELDS)).to_pylist()


class MathQAEnv(TextEnv):
    """Math word problems. Public state: `question`, `gold_answer`, `questions` (the data set)."""

    instruction = (
        "You are solving math word problems. Answer with the final number only, without units or "
        "explanation, for example 42."
    )
    actions = None

    def __init__(self, path: str | None = None, max_attempts: int = 1, render_mode: str | None = None) -> None:
        question_set = load_questions(path)
        self.questions = question_set.pairs
        self.path = path
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
