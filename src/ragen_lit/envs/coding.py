"""Coding: write a Python program that passes a problem's tests (DeepCoder-style; docs/METHOD.md §6, Coding).

The action is a whole program: the text inside `<answer>…</answer>`, or the first ```` ```python ```` block
in it when there is one. A program that does not parse as Python is an invalid action (format penalty,
no attempt used). A valid one runs in the sandbox (`ragen_lit.envs.sandbox`) on every test of the
problem; its outputs are compared here, outside the sandbox, with the expected ones.

Reward: the episode's return is the best fraction of tests any attempt passed (each attempt earns what
it adds to the best so far), so repairing a program pays and resubmitting it does not. Passing every
test is success and ends the episode. With `max_attempts` > 1 a failing attempt's observation is the
problem plus feedback: how many tests passed and, for up to `feedback_tests` failing ones, the input,
expected and actual output (examples shown in the problem) or only what went wrong (hidden tests).

Problems come from a JSONL or parquet file (`path`), by default the bundled generated set
`ragen_lit/envs/data/coding_synthetic.jsonl` (function-writing tasks, `scripts/make_coding_data.py`).
Records in these shapes are read as they are:
* ragen_lit's own: `prompt`, `fn_name` (null for stdin/stdout), `tests` [{`input`, `output`}], `public_tests`
  (how many of the first tests the prompt shows), optional `solution`;
* DeepCoder (agentica-org/DeepCoder-Preview-Dataset): `problem`, `tests` (JSON text: a list of
  {`input`, `output`, `testtype`: stdin | functional} or {`type`: stdin_stdout | function_call, `fn_name`},
  or TACO's dict), `starter_code`, `metadata` (JSON text with `func_name`);
* TACO / APPS: `question`, `input_output` (JSON text {`inputs`, `outputs`, optional `fn_name`}), `starter_code`,
  `solutions` (JSON text, a list of programs);
* LiveCodeBench (code_generation_lite): `question_content`, `starter_code`, `public_test_cases` and
  `private_test_cases` (JSON text, the private ones possibly base64 + zlib + pickle of JSON text; read with
  an unpickler that builds plain strings only), `metadata` (JSON text with `func_name`).
Functional tests of TACO-shaped data wrap the expected value in a one-element list; either form passes.
"""

from __future__ import annotations

import ast
import base64
import functools
import importlib.resources
import io
import json
import math
import pickle
import re
import textwrap
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gymnasium.spaces import Text

from ragen_lit.envs.base import CHARSET, OptionError, TextEnv, check_int
from ragen_lit.envs.records import SUFFIXES, read_records
from ragen_lit.envs.sandbox import ProgramRun, SandboxLimits, run_program

MAX_PROGRAM_CHARS = 20_000
SHOWN_CHARS = 160  # of one input/expected/actual value in the feedback
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|$)", re.DOTALL | re.IGNORECASE)
_DEF = re.compile(r"^\s*def\s+([A-Za-z_]\w*)\s*\(", re.MULTILINE)


@dataclass(frozen=True)
class CodeTest:
    input: Any  # stdin text, or the list of arguments of a function test
    output: Any  # expected stdout text, or the expected return value (JSON)
    public: bool = False  # shown in the problem statement: feedback may reveal it


@dataclass(frozen=True)
class Problem:
    prompt: str
    tests: tuple[CodeTest, ...]
    fn_name: str | None = None  # None: a stdin/stdout program
    solution: str | None = None
    wrapped_outputs: bool = False  # TACO-style functional outputs: `[value]` also accepts `value`


# ------------------------------------------------------------------------------------ data loading
def default_data_path() -> Path:
    return Path(str(importlib.resources.files("ragen_lit.envs").joinpath("data", "coding_synthetic.jsonl")))


@dataclass(frozen=True)
class ProblemSet:
    problems: tuple[Problem, ...]
    charset: frozenset[str]
    max_prompt_length: int


def load_problems(path: str | Path | None = None) -> ProblemSet:
    """The problems of a JSONL or parquet file (default: the bundled set); cached per file and mtime."""
    file = default_data_path() if path is None else Path(path).expanduser()
    if not file.is_file():
        raise OptionError("path", str(file), "an existing .jsonl or .parquet file")
    return _load_cached(str(file.resolve()), file.stat().st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _load_cached(file: str, mtime_ns: int) -> ProblemSet:
    if not file.endswith(SUFFIXES):
        raise OptionError("path", file, "a .jsonl or .parquet file")
    records, _ = read_records(file)
    problems = []
    for index, record in enumerate(records):
        try:
            problem = problem_from_record(record)
        except (ValueError, TypeError, KeyError, zlib.error, pickle.UnpicklingError) as error:
            raise OptionError("path", file, f"coding problems (record {index}: {error})") from None
        if problem.tests:
            problems.append(problem)
    if not problems:
        raise OptionError("path", file, "a file with at least one problem that has tests")
    prompts = [p.prompt for p in problems]
    return ProblemSet(tuple(problems), CHARSET | frozenset("".join(prompts)) | {"\t"}, max(map(len, prompts)))


def problem_from_record(record: dict[str, Any]) -> Problem:
    """One problem from a record in any of the supported shapes (see the module docstring)."""
    if not isinstance(record, dict):
        raise ValueError(f"a record is a JSON object, not {type(record).__name__}")
    if "prompt" in record and "tests" in record:
        return _native(record)
    if "problem" in record and "tests" in record:
        return _deepcoder(record)
    if "question" in record and "input_output" in record:
        return _taco(record)
    if "question_content" in record:
        return _livecodebench(record)
    raise ValueError(f"unknown record shape (keys {sorted(record)})")


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, (str, bytes)) else value


def _with_starter(statement: str, starter: str | None) -> str:
    statement = str(statement).strip()
    if starter and str(starter).strip():
        statement += "\n\nStarter code:\n" + str(starter).strip()
    return statement


def _fn_name(metadata: Any, starter: str | None) -> str | None:
    meta = _json(metadata) if metadata else {}
    if isinstance(meta, dict) and meta.get("func_name"):
        return str(meta["func_name"])
    match = _DEF.search(starter or "")
    return match.group(1) if match else None


def _native(record: dict[str, Any]) -> Problem:
    public = int(record.get("public_tests", 0))
    tests = tuple(CodeTest(t["input"], t["output"], i < public) for i, t in enumerate(_json(record["tests"])))
    return Problem(str(record["prompt"]).strip(), tests, record.get("fn_name"), record.get("solution"))


def _lines_as_arguments(text: str) -> list[Any]:
    """LiveCodeBench functional input: one JSON value per line."""
    return [json.loads(line) for line in str(text).split("\n") if line.strip()]


def _io_tests(io_spec: dict[str, Any]) -> tuple[tuple[CodeTest, ...], str | None]:
    """TACO's {inputs, outputs, fn_name}: stdio texts (lists of lines joined) or argument lists."""
    fn_name = io_spec.get("fn_name")
    tests = []
    for test_input, test_output in zip(io_spec.get("inputs", []), io_spec.get("outputs", [])):
        if fn_name:
            tests.append(CodeTest(test_input if isinstance(test_input, list) else [test_input], test_output))
        else:
            join = "\n".join
            tests.append(
                CodeTest(
                    join(test_input) if isinstance(test_input, list) else str(test_input),
                    join(test_output) if isinstance(test_output, list) else str(test_output),
                )
            )
    return tuple(tests), fn_name


def _deepcoder(record: dict[str, Any]) -> Problem:
    tests_spec = _json(record["tests"])
    starter = record.get("starter_code")
    statement = _with_starter(record["problem"], starter)
    if isinstance(tests_spec, dict):  # the TACO subset keeps TACO's shape
        tests, fn_name = _io_tests(tests_spec)
        return Problem(statement, tests, fn_name, None, wrapped_outputs=bool(fn_name))
    tests, fn_name, wrapped = [], None, False
    for spec in tests_spec:
        kind = spec.get("testtype") or spec.get("type") or "stdin"
        if kind in ("functional", "function_call"):
            fn_name = spec.get("fn_name") or fn_name or _fn_name(record.get("metadata"), starter)
            if isinstance(spec["input"], list):  # PrimeIntellect: argument list, output wrapped in a list
                tests.append(CodeTest(spec["input"], spec["output"]))
                wrapped = True
            else:  # LiveCodeBench: one JSON argument per line
                tests.append(CodeTest(_lines_as_arguments(spec["input"]), json.loads(spec["output"])))
        else:
            tests.append(CodeTest(str(spec["input"]), str(spec["output"])))
    if any(isinstance(t.input, list) for t in tests) and fn_name is None:
        raise ValueError("functional tests without a function name")
    return Problem(statement, tuple(tests), fn_name, None, wrapped_outputs=wrapped)


def _taco(record: dict[str, Any]) -> Problem:
    tests, fn_name = _io_tests(_json(record["input_output"]))
    solutions = _json(record.get("solutions") or "[]")
    solution = solutions[0] if isinstance(solutions, list) and solutions else None
    statement = _with_starter(record["question"], record.get("starter_code"))
    return Problem(statement, tests, fn_name, solution, wrapped_outputs=bool(fn_name))


class _StringsOnly(pickle.Unpickler):
    """Unpickles plain data only: a pickle that names any class or function is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a test-case pickle")


def _lcb_cases(value: Any) -> list[dict[str, Any]]:
    if not value:
        return []
    if isinstance(value, list):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raw = _StringsOnly(io.BytesIO(zlib.decompress(base64.b64decode(value)))).load()
        return json.loads(raw) if isinstance(raw, (str, bytes)) else raw


def _livecodebench(record: dict[str, Any]) -> Problem:
    starter = record.get("starter_code")
    fn_name = _fn_name(record.get("metadata"), starter)
    public = _lcb_cases(record.get("public_test_cases"))
    private = _lcb_cases(record.get("private_test_cases"))
    tests = []
    for number, spec in enumerate(public + private):
        shown = number < len(public)
        if spec.get("testtype") == "functional":
            if fn_name is None:
                raise ValueError("functional tests without a function name")
            tests.append(CodeTest(_lines_as_arguments(spec["input"]), json.loads(spec["output"]), shown))
        else:
            tests.append(CodeTest(str(spec["input"]), str(spec["output"]), shown))
    functional = any(isinstance(t.input, list) for t in tests)
    statement = _with_starter(record["question_content"], starter)
    return Problem(statement, tuple(tests), fn_name if functional else None)


# ------------------------------------------------------------------------------------ checking
def extract_program(text: str) -> str | None:
    """The program in an answer: the first fenced code block if there is one, else the whole text;
    None when it is empty, too long, or not valid Python."""
    if not isinstance(text, str):
        return None
    fenced = _FENCE.search(text)
    program = textwrap.dedent(fenced.group(1)).strip() if fenced else text.strip()
    if not program or len(program) > MAX_PROGRAM_CHARS:
        return None
    try:
        ast.parse(program)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    return program


def _close(expected: Any, actual: Any) -> bool:
    if isinstance(expected, bool) or isinstance(actual, bool):
        return expected is actual or expected == actual and type(expected) is type(actual)
    if isinstance(expected, (int, float)) and isinstance(actual, (int, float)):
        return math.isclose(expected, actual, rel_tol=1e-6, abs_tol=1e-6)
    if isinstance(expected, list) and isinstance(actual, list):
        return len(expected) == len(actual) and all(_close(e, a) for e, a in zip(expected, actual))
    if isinstance(expected, dict) and isinstance(actual, dict):
        return expected.keys() == actual.keys() and all(_close(expected[k], actual[k]) for k in expected)
    return expected == actual


def _stdout_matches(expected: str, actual: str) -> bool:
    """Line by line, trailing blanks ignored; then token by token with a float tolerance."""
    want = [line.rstrip() for line in str(expected).strip().split("\n")]
    got = [line.rstrip() for line in str(actual).strip().split("\n")]
    if want == got:
        return True
    want_tokens, got_tokens = " ".join(want).split(), " ".join(got).split()
    if len(want_tokens) != len(got_tokens):
        return False
    for w, g in zip(want_tokens, got_tokens):
        if w == g:
            continue
        try:
            if not math.isclose(float(w), float(g), rel_tol=1e-6, abs_tol=1e-6):
                return False
        except ValueError:
            return False
    return True


def passes(problem: Problem, test: CodeTest, status: str, output: Any) -> bool:
    if status != "ok":
        return False
    if problem.fn_name is None:
        return _stdout_matches(test.output, output or "")
    if _close(test.output, output):
        return True
    wrapped = problem.wrapped_outputs and isinstance(test.output, list) and len(test.output) == 1
    return wrapped and _close(test.output[0], output)


# ------------------------------------------------------------------------------------ the env
class CodingEnv(TextEnv):
    """Write a Python program. Public state: `problem`, `problems`, `last_run`, `best_fraction`."""

    instruction = (
        "You are writing Python programs. Answer with a complete Python program (a ```python block is fine); "
        "it runs against hidden tests and scores the fraction it passes."
    )
    actions = None
    steps_wait = True  # a step waits for its sandboxed program: the rollout loop runs a turn's steps in threads

    def __init__(
        self,
        path: str | None = None,
        max_attempts: int = 1,
        feedback_tests: int = 2,
        wall_seconds: float = 4.0,
        test_seconds: float = 1.0,
        memory_mb: int = 512,
        render_mode: str | None = None,
    ) -> None:
        problem_set = load_problems(path)
        self.problems = problem_set.problems
        self.path = path
        self.feedback_tests = check_int("feedback_tests", feedback_tests, 0)
        for key, value in (("wall_seconds", wall_seconds), ("test_seconds", test_seconds)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 600:
                raise OptionError(key, value, "a number of seconds in (0, 600]")
        memory_mb = check_int("memory_mb", memory_mb, 64)
        self.limits = SandboxLimits(
            wall_seconds=float(wall_seconds),
            test_seconds=float(test_seconds),
            cpu_seconds=max(1, math.ceil(wall_seconds)),
            memory_bytes=memory_mb * 2**20,
        )
        self.problem = self.problems[0]
        self.best_fraction = 0.0
        self.last_run: ProgramRun | None = None
        self._feedback = ""
        self._solved = False
        feedback_bound = 200 + self.feedback_tests * (3 * SHOWN_CHARS + 120)
        super().__init__(
            max_actions_per_episode=check_int("max_attempts", max_attempts, 1),
            observation_max_length=problem_set.max_prompt_length + feedback_bound,
            observation_charset=problem_set.charset,
            render_mode=render_mode,
        )
        self.action_space = Text(max_length=MAX_PROGRAM_CHARS, min_length=0, charset=CHARSET | {"\t"})

    @property
    def max_attempts(self) -> int:
        return self.max_actions_per_episode

    def parse_action(self, text: str) -> str | None:
        return extract_program(text)

    # ----------------------------------------------------------------------------- TextEnv hooks
    @property
    def item_count(self) -> int:
        return len(self.problems)

    def _new_episode(self, seed: int) -> None:
        self.problem = self.problems[seed % len(self.problems)]
        self.best_fraction = 0.0
        self.last_run = None
        self._feedback = ""
        self._solved = False

    @property
    def is_success(self) -> bool:
        return self._solved

    def _apply(self, action: str) -> tuple[float, bool]:
        problem = self.problem
        run = run_program(action, [t.input for t in problem.tests], problem.fn_name, self.limits)
        self.last_run = run
        passed = [passes(problem, t, r.status, r.output) for t, r in zip(problem.tests, run.tests)]
        fraction = sum(passed) / len(problem.tests)
        reward = max(0.0, fraction - self.best_fraction)
        self.best_fraction = max(self.best_fraction, fraction)
        self._solved = all(passed)
        self._feedback = self._describe(run, passed)
        return reward, self._solved

    def _describe(self, run: ProgramRun, passed: list[bool]) -> str:
        lines = [f"Your program passed {sum(passed)} of {len(passed)} tests."]
        failures = [i for i, ok in enumerate(passed) if not ok][: self.feedback_tests]
        for i in failures:
            test, result = self.problem.tests[i], run.tests[i]
            problem_kind = "wrong answer" if result.status == "ok" else (result.error or result.status)
            if test.public:
                lines.append(f"Failed test: input {_show(test.input)}")
                lines.append(f"  expected {_show(test.output)}, got {_show(result.output)} ({problem_kind})")
            else:
                lines.append(f"A hidden test failed: {_show(problem_kind)}")
        return self._clean("\n".join(lines))

    def _clean(self, text: str) -> str:
        charset = self.observation_space.character_set
        return "".join(c if c in charset else "?" for c in text)

    def _observation(self) -> str:
        text = self.problem.prompt
        if self._feedback and not self._solved:
            text += "\n\n" + self._feedback
        return text


def _show(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    text = text.replace("\n", "\\n")
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."
