"""SearchQA: answer a question by searching a local corpus (docs/METHOD.md §6, SearchQA; the reference's search env).

Actions are `search[query]` and `answer[text]`. A search returns the `top_k` passages of a BM25 retriever
(`ragen_lit.envs.bm25`) as the next observation, each cut to `passage_max_chars`; at most `max_searches`
searches, then the agent must answer (a further search ends the episode unanswered). An answer ends the
episode: the reward is its SQuAD F1 against the gold answers (`reward="f1"`, the best over several golds) or
its exact match (`reward="em"`), after SQuAD's normalisation (lower case, no punctuation, no articles a/an/the,
single spaces); success = exact match. Anything else is an invalid action (the rollout's format penalty).

Data (`path`, `corpus_path`): by default the bundled generated set (`envs/data/search_qa_questions.jsonl` over
`envs/data/search_qa_corpus.jsonl`, made by `scripts/make_search_qa_data.py`: single- and multi-hop questions
about made-up companies, people, cities and countries). Otherwise a question file (.jsonl, .json array or
.parquet) of records with `question` and `answer`, the answer a string or a list of accepted strings, as in
NQ-open (`{"question": ..., "answer": [...]}`) and HotpotQA (`{"question": ..., "answer": ..., "context": ...}`);
a HotpotQA `context` (the original `[[title, [sentence, ...]], ...]` or the Hugging Face
`{"title": [...], "sentences": [[...], ...]}`) adds its paragraphs to the corpus. The corpus is the union of
those paragraphs and a `corpus_path` file (.jsonl or .parquet) of `id`/`title`/`text` records. The instance
of seed s is question `s % len(questions)`.
"""

from __future__ import annotations

import functools
import importlib.resources
import numbers
import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragen_lit.envs.base import ACTION_MAX_LENGTH, CHARSET, OptionError, TextEnv, check_int, check_probability
from ragen_lit.envs.bm25 import BM25Index
from ragen_lit.envs.records import SUFFIXES
from ragen_lit.envs.records import read_records as read_file_records

QUESTIONS_FILE = "search_qa_questions.jsonl"
CORPUS_FILE = "search_qa_corpus.jsonl"
CORPUS_FIELDS = ("id", "title", "text")
REWARDS = ("f1", "em")
_ACTION = re.compile(r"^\s*(search|answer)\s*\[(.*)\]\s*$", re.IGNORECASE | re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


# ------------------------------------------------------------------------------------------- scoring
def normalize_answer(text: str) -> str:
    """SQuAD's answer normalisation: lower case, punctuation removed, articles removed, single spaces."""
    text = _ARTICLES.sub(" ", str(text).lower().translate(_PUNCTUATION))
    return " ".join(text.split())


def exact_match(prediction: str, golds: Sequence[str]) -> bool:
    """Whether `prediction` equals one of `golds` after `normalize_answer` (an empty normalised answer never does)."""
    predicted = normalize_answer(prediction)
    return bool(predicted) and any(predicted == normalize_answer(gold) for gold in golds)


def f1_score(prediction: str, golds: Sequence[str]) -> float:
    """SQuAD's token F1 of `prediction` against the best of `golds` (bags of normalised tokens)."""
    predicted = normalize_answer(prediction).split()
    best = 0.0
    for gold in golds:
        expected = normalize_answer(gold).split()
        common = sum((Counter(predicted) & Counter(expected)).values())
        if common:
            precision, recall = common / len(predicted), common / len(expected)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


# ---------------------------------------------------------------------------------------------- data
@dataclass(frozen=True)
class Passage:
    title: str
    text: str


@dataclass(frozen=True)
class SearchData:
    """Questions, the corpus and its BM25 index (built once per file pair and BM25 setting)."""

    questions: tuple[tuple[str, tuple[str, ...]], ...]  # (question, accepted answers)
    passages: tuple[Passage, ...]
    index: BM25Index
    charset: frozenset[str]
    max_question_length: int
    max_title_length: int


def default_questions_path() -> Path:
    return Path(str(importlib.resources.files("ragen_lit.envs").joinpath("data", QUESTIONS_FILE)))


def default_corpus_path() -> Path:
    return Path(str(importlib.resources.files("ragen_lit.envs").joinpath("data", CORPUS_FILE)))


def load_search_data(
    path: str | Path | None = None, corpus_path: str | Path | None = None, k1: float = 1.2, b: float = 0.75
) -> SearchData:
    """The questions of `path` over the corpus of `corpus_path` plus the questions' contexts (defaults: the
    bundled set and its corpus); cached per files, modification times and BM25 setting, so the many envs of
    a rollout share one index."""
    if path is None:
        questions_file = default_questions_path()
        corpus_file = default_corpus_path() if corpus_path is None else _existing("corpus_path", corpus_path)
    else:
        questions_file = _existing("path", path)
        corpus_file = None if corpus_path is None else _existing("corpus_path", corpus_path)
    corpus_key = None if corpus_file is None else (str(corpus_file.resolve()), corpus_file.stat().st_mtime_ns)
    return _load_cached(
        (str(questions_file.resolve()), questions_file.stat().st_mtime_ns), corpus_key, float(k1), float(b)
    )


def _existing(key: str, path: str | Path) -> Path:
    file = Path(path).expanduser()
    if not file.is_file():
        raise OptionError(key, str(file), "an existing .jsonl, .json or .parquet file")
    return file


@functools.lru_cache(maxsize=8)
def _load_cached(questions_key: tuple[str, int], corpus_key: tuple[str, int] | None, k1: float, b: float) -> SearchData:
    questions_file = questions_key[0]
    questions, passages = [], []
    for number, record in enumerate(read_records("path", questions_file)):
        questions.append(_question(record, number, questions_file))
        if isinstance(record, dict) and record.get("context") is not None:
            passages.extend(_context_passages(record["context"], number, questions_file))
    if not questions:
        raise OptionError("path", questions_file, "a file with at least one question")
    if corpus_key is not None:
        for number, record in enumerate(read_records("corpus_path", corpus_key[0])):
            if not isinstance(record, dict) or any(field not in record for field in CORPUS_FIELDS):
                keys = sorted(record) if isinstance(record, dict) else type(record).__name__
                raise OptionError(
                    "corpus_path", corpus_key[0], f"records with 'id', 'title' and 'text' (record {number} has {keys})"
                )
            passages.append(Passage(_clean(record["title"]), _clean(record["text"])))
    passages = list(dict.fromkeys(p for p in passages if p.text))  # HotpotQA contexts repeat across questions
    if not passages and corpus_key is not None:
        raise OptionError("corpus_path", corpus_key[0], "a corpus with at least one non-empty passage")
    if not passages:
        raise OptionError(
            "corpus_path",
            None,
            f"a .jsonl or .parquet file of id/title/text passages ({questions_file} has no context)",
        )
    index = BM25Index([f"{p.title} {p.text}" for p in passages], k1=k1, b=b)
    texts = [q for q, _ in questions] + [p.title + p.text for p in passages]
    return SearchData(
        questions=tuple(questions),
        passages=tuple(passages),
        index=index,
        charset=CHARSET | frozenset("".join(texts)),
        max_question_length=max(len(q) for q, _ in questions),
        max_title_length=max(len(p.title) for p in passages),
    )


def read_records(key: str, file: str) -> list[Any]:
    """The records of a .jsonl (one JSON value per line), .json (one array) or .parquet file (`envs.records`);
    a file it cannot read is an `OptionError` on `key`."""
    if not file.endswith(SUFFIXES):
        raise OptionError(key, file, "a .jsonl, .json or .parquet file")
    return read_file_records(file, key)[0]


def _clean(value: Any) -> str:
    return " ".join(str(value).split()) if value is not None else ""


def _question(record: Any, number: int, file: str) -> tuple[str, tuple[str, ...]]:
    if not isinstance(record, dict) or "question" not in record or "answer" not in record:
        keys = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise OptionError("path", file, f"records with 'question' and 'answer' fields (record {number} has {keys})")
    answers = record["answer"]
    answers = [answers] if isinstance(answers, (str, numbers.Number)) else answers
    golds = tuple(_clean(a) for a in (answers if isinstance(answers, (list, tuple)) else []) if _clean(a))
    question = _clean(record["question"])
    if not question or not golds:
        raise OptionError(
            "path", file, f"a non-empty question and answer (a string or a list of strings; record {number})"
        )
    return question, golds


def _context_passages(context: Any, number: int, file: str) -> list[Passage]:
    """HotpotQA paragraphs: `[[title, [sentences]], ...]` (original files) or `{"title": [...],
    "sentences": [[...]]}` (Hugging Face datasets)."""
    if (
        isinstance(context, dict)
        and isinstance(context.get("title"), list)
        and isinstance(context.get("sentences"), list)
    ):
        pairs = list(zip(context["title"], context["sentences"]))
    elif isinstance(context, list) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in context):
        pairs = [(p[0], p[1]) for p in context]
    else:
        raise OptionError(
            "path", file, f"a HotpotQA context: [[title, [sentences]], ...] or {{title, sentences}} (record {number})"
        )
    passages = []
    for title, sentences in pairs:
        text = " ".join(str(s).strip() for s in sentences) if isinstance(sentences, (list, tuple)) else str(sentences)
        passages.append(Passage(_clean(title), _clean(text)))
    return passages


# ----------------------------------------------------------------------------------------------- env
def _check_number(key: str, value: Any, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value >= minimum:
        raise OptionError(key, value, f"a number >= {minimum}")
    return float(value)


class SearchQAEnv(TextEnv):
    """Question answering with a search tool. Public state: `question`, `gold_answers`, `searches_left`,
    `results` (the last search's passages), `data` (the loaded set and index)."""

    instruction = (
        "You answer questions by searching a small encyclopedia. Actions: search[query] shows the passages that "
        "best match query; answer[text] gives your final answer (a short name, place or number) and ends the "
        "episode. Search one name at a time; a question may need several searches. For example: search[Zorvex "
        "Labs] or answer[Tarnholt]."
    )
    actions = None

    def __init__(
        self,
        path: str | None = None,
        corpus_path: str | None = None,
        max_searches: int = 3,
        top_k: int = 3,
        passage_max_chars: int = 200,
        reward: str = "f1",
        k1: float = 1.2,
        b: float = 0.75,
        render_mode: str | None = None,
    ) -> None:
        self.max_searches = check_int("max_searches", max_searches, 0)
        self.top_k = check_int("top_k", top_k, 1)
        self.passage_max_chars = check_int("passage_max_chars", passage_max_chars, 1)
        if reward not in REWARDS:
            raise OptionError("reward", reward, "'f1' or 'em'")
        self.reward = reward
        k1 = _check_number("k1", k1, 0.0)
        b = check_probability("b", b, allow_zero=True)
        self.data = load_search_data(path, corpus_path, k1=k1, b=b)
        self.path, self.corpus_path = path, corpus_path
        self.question, self.gold_answers = self.data.questions[0]
        self.searches_left = self.max_searches
        self.last_query: str | None = None
        self.results: list[Passage] = []
        self.final_answer: str | None = None
        self._solved = False
        # the longest observation: question, search line, top_k passages and the answer line
        longest = (
            self.data.max_question_length
            + 2 * ACTION_MAX_LENGTH
            + 80
            + self.top_k * (self.data.max_title_length + self.passage_max_chars + 16)
        )
        super().__init__(
            max_actions_per_episode=self.max_searches + 1,
            observation_max_length=longest,
            observation_charset=self.data.charset,
            render_mode=render_mode,
        )

    def parse_action(self, text: str) -> str | None:
        """`search[query]` or `answer[text]` (keyword case-insensitive, content stripped and non-empty),
        returned as `search[query]` / `answer[text]`; None for anything else."""
        match = _ACTION.match(text) if isinstance(text, str) else None
        if match is None or not match.group(2).strip():
            return None
        return f"{match.group(1).lower()}[{' '.join(match.group(2).split())}]"

    # ----------------------------------------------------------------------------- TextEnv hooks
    @property
    def item_count(self) -> int:
        return len(self.data.questions)

    def _new_episode(self, seed: int) -> None:
        self.question, self.gold_answers = self.data.questions[seed % len(self.data.questions)]
        self.searches_left = self.max_searches
        self.last_query, self.results, self.final_answer = None, [], None
        self._solved = False

    @property
    def is_success(self) -> bool:
        return self._solved

    def _apply(self, action: str) -> tuple[float, bool]:
        kind, content = action[: action.index("[")], action[action.index("[") + 1 : -1]
        if kind == "answer":
            self.final_answer = content
            self._solved = exact_match(content, self.gold_answers)
            reward = float(self._solved) if self.reward == "em" else f1_score(content, self.gold_answers)
            return reward, True
        if self.searches_left == 0:
            # over the limit: this action uses up the budget (max_searches + 1), the episode ends unanswered
            self.last_query, self.results = None, []
            return 0.0, False
        self.last_query = content
        self.searches_left -= 1
        self.results = [self.data.passages[i] for i, _ in self.data.index.search(content, self.top_k)]
        return 0.0, False

    def _observation(self) -> str:
        lines = [f"Question: {self.question}", f"Searches left: {self.searches_left}"]
        if self.final_answer is not None:
            lines.append(f"Answered: {self.final_answer}")
        elif self.searches_left == 0 and self.num_actions > self.max_searches:
            lines.append("No searches left.")
        elif self.last_query is not None:
            if self.results:
                lines.append(f'Results for "{self.last_query}":')
                lines.extend(f"[{rank}] {p.title}: {self._cut(p.text)}" for rank, p in enumerate(self.results, 1))
            else:
                lines.append(f'Results for "{self.last_query}": none')
        return "\n".join(lines)

    def _cut(self, text: str) -> str:
        if len(text) <= self.passage_max_chars:
            return text
        return text[: self.passage_max_chars].rstrip() + "..."
