"""docs/REPRODUCTION.md is what its commands print, from the stores committed next to it.

Every table on the page is one of:

- printed by the `python -m ragen_lit compare` commands of the nearest bash block above it: those commands run here
  as printed (the CLI's own parser and `run_compare`), and the tables they print, all of them and in order, must be
  the tables on the page between that block and the next one, verbatim;
- the summary, each number of whose "measured here" column is quoted from a table that `compare` prints below it;
- the warm-start records, each cell read from the `warm_start.json` its first cell names.

A `text` block right after a bash block of `python scripts/reasoning_samples.py` commands is what they print.

The page extracts each store into its own folder, `/tmp/results/<store>`; here that is a temporary folder holding the
stores the commands read. Runs are loaded once per store and shared between commands, and each comparison's figures
and MLflow record are skipped: neither changes what `compare` prints. A number edited by hand, a table left behind
when its command changed, a command that no longer runs, or a change to `compare` that prints the page differently
fails here.
"""

from __future__ import annotations

import contextlib
import glob
import io
import json
import re
import shlex
import tarfile
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest

from ragen_lit import cli
from ragen_lit.analysis import compare, runs

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "REPRODUCTION.md"
STORES = ROOT / "docs" / "results"
PAGE_ROOT = "/tmp/results/"  # where the page extracts the stores
EXTRACT = (
    'for f in docs/results/*.tar.xz; do s=$(basename "$f" .tar.xz); mkdir -p "/tmp/results/$s" '
    '&& tar -xJf "$f" -C "/tmp/results/$s"; done'
)
COMPARE = ["python", "-m", "ragen_lit", "compare"]
SUMMARY_HEAD = "| paper's finding |"
WARM_START_HEAD = "| warm-start record |"
# a number standing alone (not part of a name such as SmolLM2 or 3B), with its sign
NUMBER = re.compile(r"(?<![\w.])[+-]?\d+(?:\.\d+)?(?:e[+-]?\d+)?(?!\w)(?!\.\d)")


@dataclass
class Block:
    """A bash block of the page: its line, its `compare` commands (argv after `python -m ragen_lit`) and the tables
    between it and the next bash block."""

    line: int
    heading: str
    commands: list[list[str]]
    tables: list[str]


def parse_page(text: str) -> tuple[list[Block], list[str]]:
    """The page's bash blocks (each with the tables that follow it) and the tables above the first one."""
    blocks: list[Block] = []
    before: list[str] = []
    heading, fence, code, table = "", None, [], []

    def close_table():
        if table:
            (blocks[-1].tables if blocks else before).append("\n".join(table))
            table.clear()

    for number, line in enumerate(text.splitlines(), 1):
        if fence is not None:
            if line.startswith("```"):
                if fence == "bash":
                    blocks.append(Block(number, heading, compare_commands("\n".join(code)), []))
                fence, code = None, []
            else:
                code.append(line)
            continue
        if line.startswith("|"):
            table.append(line)
            continue
        close_table()
        if line.startswith("```"):
            fence = line[3:].strip()
        elif line.startswith("#"):
            heading = line.lstrip("#").strip()
    close_table()
    return blocks, before


def compare_commands(code: str) -> list[list[str]]:
    """The `python -m ragen_lit compare` commands of a bash block, as argv words after `python -m ragen_lit`."""
    commands = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words[: len(COMPARE)] == COMPARE:
            commands.append(words[len(COMPARE) - 1 :])
    return commands


def printed_tables(output: str) -> list[str]:
    """The markdown tables in what a command printed, in order."""
    tables, current = [], []
    for line in output.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append("\n".join(current))
            current = []
    return tables


def stores_named(argv: list[str]) -> set[str]:
    """The stores (`/tmp/results/<store>/...`) a command reads."""
    return {word[len(PAGE_ROOT) :].split("/")[0] for word in argv if word.startswith(PAGE_ROOT)}


def local_argv(argv: list[str], root: Path) -> list[str]:
    """The command with the page's store folder replaced by `root`, its globs expanded as the shell does (sorted)."""
    words = []
    for word in argv:
        word = str(root) + "/" + word[len(PAGE_ROOT) :] if word.startswith(PAGE_ROOT) else word
        if any(c in word for c in "*?["):
            matches = sorted(glob.glob(word))
            assert matches, f"{word} matches nothing"
            words.extend(matches)
        else:
            words.append(word)
    return words


class Stores:
    """The page's stores, each extracted on first use into `root/<store>`, and their runs loaded once per store."""

    def __init__(self, root: Path):
        self.root = root
        self.loaded: dict[str, list[runs.RunRecord]] = {}
        self.load_runs = runs.load_runs

    def extract(self, store: str) -> None:
        folder = self.root / store
        if not folder.exists():
            archive = STORES / f"{store}.tar.xz"
            assert archive.exists(), f"the page reads /tmp/results/{store}, but docs/results has no {archive.name}"
            with tarfile.open(archive) as tar:
                tar.extractall(folder, filter="data")

    def load(self, uris):
        for uri in uris:
            if uri not in self.loaded:
                self.loaded[uri] = self.load_runs([uri])
        return [run for uri in uris for run in self.loaded[uri]]

    def run(self, argv: list[str]) -> str:
        """What `python -m ragen_lit <argv>` prints to stdout (it must succeed)."""
        for store in stores_named(argv):
            self.extract(store)
        out, err = io.StringIO(), io.StringIO()
        with (
            mock.patch.object(compare, "load_runs", self.load),
            mock.patch.object(compare, "write_figures", lambda groups, folder: []),
            mock.patch.object(compare, "log_comparison", lambda uri, files, tags: "not-logged"),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            code = cli.main(local_argv(argv, self.root))
        assert code == 0, f"python -m ragen_lit {shlex.join(argv)} failed:\n{err.getvalue()}"
        return out.getvalue()


PAGE_TEXT = PAGE.read_text()
BLOCKS, TOP_TABLES = parse_page(PAGE_TEXT)
COMPARE_BLOCKS = [block for block in BLOCKS if block.commands]


def all_tables() -> list[str]:
    return TOP_TABLES + [table for block in BLOCKS for table in block.tables]


def is_special(table: str) -> bool:
    return table.startswith((SUMMARY_HEAD, WARM_START_HEAD))


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    return Stores(tmp_path_factory.mktemp("results"))


def test_the_page_extracts_each_store_into_its_own_folder():
    assert EXTRACT in PAGE_TEXT


def test_every_table_is_printed_by_the_commands_above_it_or_built_as_the_page_says():
    loose = [t for t in TOP_TABLES if not is_special(t)]
    loose += [t for block in BLOCKS if not block.commands for t in block.tables if not is_special(t)]
    assert not loose, "tables with no compare command above them:\n\n" + "\n\n".join(t[:300] for t in loose)
    specials = [t for t in all_tables() if is_special(t)]
    assert len(specials) == 2 and summary_table() in specials and warm_start_table() in specials
    assert len(COMPARE_BLOCKS) >= 20


@pytest.mark.slow
@pytest.mark.parametrize("block", COMPARE_BLOCKS, ids=[f"line{b.line}" for b in COMPARE_BLOCKS])
def test_the_commands_print_the_tables_below_them(stores, block):
    printed = [table for argv in block.commands for table in printed_tables(stores.run(argv))]
    shown = [table for table in block.tables if not is_special(table)]
    assert shown == printed, (
        f"the page's tables after line {block.line} ({block.heading}) are not what its commands print; they print:\n\n"
        + "\n\n".join(printed)
    )


def summary_table() -> str:
    found = [t for t in all_tables() if t.startswith(SUMMARY_HEAD)]
    assert len(found) == 1, "the page has one summary table"
    return found[0]


def cells(row: str) -> list[str]:
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


def numbers(text: str) -> set[str]:
    return set(NUMBER.findall(text.replace("−", "-").replace("\\|", "|")))


def test_the_summary_quotes_its_numbers_from_the_tables_compare_prints():
    rows = summary_table().splitlines()
    column = cells(rows[0]).index("measured here")
    printed = set().union(*(numbers(t) for block in COMPARE_BLOCKS for t in block.tables))
    assert len(rows) > 8
    for row in rows[2:]:
        paper, measured = cells(row)[0], re.sub(r"\*\*|`[^`]*`", "", cells(row)[column])  # `code` is a setting
        quoted = numbers(measured) - numbers(paper)  # a number may restate the paper's setting beside it
        assert quoted, f"a summary row with no measured number: {row[:120]}"
        assert quoted <= printed, f"{sorted(quoted - printed)} in the summary, in no table compare printed ({row[:50]})"


def warm_start_table() -> str:
    found = [t for t in all_tables() if t.startswith(WARM_START_HEAD)]
    assert len(found) == 1, "the page has one table of warm-start records"
    return found[0]


def warm_start_cells(record: dict) -> list[str]:
    """A row of the warm-start table from its `warm_start.json`: env, lr, steps, validation maps and temperature,
    success / answer format / valid action before and after, seconds."""
    v = record["validation"]

    def rates(key):
        return " / ".join(f"{v[key][k]:.1%}" for k in ("success", "format_ok_rate", "valid_turn_rate"))

    options = record["options"]
    return [
        record["env"]["name"],
        f"{options['lr']:g}",
        str(options["steps"]),
        f"{v['episodes']} at T {v['temperature']:g}",
        rates("before"),
        rates("after"),
        f"{record['seconds']:g}",
    ]


def test_the_warm_start_table_reads_its_records(stores):
    rows = warm_start_table().splitlines()[2:]
    assert len(rows) >= 4
    for row in rows:
        first, *rest = cells(row)
        path = re.fullmatch(r"`(.+)/warm_start\.json`", first)
        assert path, f"the first cell names a warm_start.json under /tmp/results: {first}"
        assert path.group(1).startswith(PAGE_ROOT)
        store = path.group(1)[len(PAGE_ROOT) :].split("/")[0]
        stores.extract(store)
        record = json.loads((stores.root / path.group(1)[len(PAGE_ROOT) :] / "warm_start.json").read_text())
        assert [c.replace("**", "") for c in rest] == warm_start_cells(record), row


def test_every_local_link_of_the_page_exists():
    targets = [part.split(")")[0] for part in PAGE_TEXT.split("](")[1:]]
    local = [t for t in targets if not t.startswith(("http://", "https://", "#"))]
    assert local, "the page links its figures"
    assert [t for t in local if not (PAGE.parent / t).exists()] == []


SAMPLES = re.compile(r"```bash\n((?:(?!```).)*)```\n\n```text\n((?:(?!```).)*)```\n", re.DOTALL)
SAMPLES_SCRIPT = ["python", "scripts/reasoning_samples.py"]


def samples_commands(code: str) -> list[list[str]]:
    """The `python scripts/reasoning_samples.py` commands of a bash block, as the script's argv."""
    words = [shlex.split(line, comments=True) for line in code.replace("\\\n", " ").splitlines()]
    return [w[len(SAMPLES_SCRIPT) :] for w in words if w[: len(SAMPLES_SCRIPT)] == SAMPLES_SCRIPT]


SAMPLE_BLOCKS = [(samples_commands(code), text) for code, text in SAMPLES.findall(PAGE_TEXT)]


def test_the_page_shows_reasonings_as_the_script_prints_them():
    assert SAMPLE_BLOCKS and all(commands for commands, _ in SAMPLE_BLOCKS)


@pytest.mark.slow
@pytest.mark.parametrize("commands,text", SAMPLE_BLOCKS)
def test_the_sample_reasonings_are_what_the_script_prints(stores, commands, text):
    import reasoning_samples

    out = io.StringIO()
    for argv in commands:
        for store in stores_named(argv):
            stores.extract(store)
        with contextlib.redirect_stdout(out):
            assert reasoning_samples.main(local_argv(argv, stores.root)) == 0
    assert out.getvalue().replace(str(stores.root) + "/", PAGE_ROOT) == text
