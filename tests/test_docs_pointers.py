"""The project cites its own method page, docs/METHOD.md, and nothing outside the repository: no text file names a
document that is not in it, and every `docs/METHOD.md §N` pointer names a section the page has."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
METHOD = ROOT / "docs" / "METHOD.md"
FOLDERS = ("src", "scripts", "tests", "conf", "docs")
SUFFIXES = {".py", ".md", ".yaml", ".sh", ".toml"}
TOP_FILES = ("README.md", "Dockerfile")
# documents outside the repository that nothing may name (built here so that this file does not name them itself)
FORBIDDEN = ("ragen2" + ".md", "ragen" + "_reference", "peers" + ".md")
SECTION = "§"  # joined at run time, so that this file's own text holds none of the pointers it looks for
# pointers to sections of some unnamed outside document, a word such as "spec" or "reference" before a section sign
LOOSE_POINTER = re.compile(r"\b(?:spec|reference)(?:'s)? §\d", re.IGNORECASE)
# "docs/METHOD.md §3", "docs/METHOD.md §5 (and §4 ...)": every section number after the page's name
POINTER = re.compile(r"docs/METHOD\.md((?:[ ,;(]*(?:and |or )?§\d+)+)")
HEADING = re.compile(r"^## §(\d+) \S", re.MULTILINE)


def text_files() -> list[Path]:
    files = [ROOT / name for name in TOP_FILES if (ROOT / name).is_file()]
    for folder in FOLDERS:
        files += [
            path
            for path in sorted((ROOT / folder).rglob("*"))
            if path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts
        ]
    return files


def method_sections() -> list[int]:
    return [int(number) for number in HEADING.findall(METHOD.read_text(encoding="utf-8"))]


def test_the_method_page_numbers_its_sections_in_order():
    sections = method_sections()
    assert sections, "docs/METHOD.md has no '## §N <title>' headings"
    assert sections == list(range(1, len(sections) + 1)), f"sections are not §1..§n in order: {sections}"


def test_no_file_names_a_document_outside_the_repository():
    found = []
    for path in text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            lowered = line.lower()
            if any(name in lowered for name in FORBIDDEN) or LOOSE_POINTER.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "cite docs/METHOD.md instead:\n" + "\n".join(found)


def test_every_method_pointer_names_an_existing_section():
    sections = set(method_sections())
    pointers, dangling = 0, []
    for path in text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in POINTER.finditer(text):
            for number in re.findall(r"§(\d+)", match.group(1)):
                pointers += 1
                if int(number) not in sections:
                    line = text.count("\n", 0, match.start()) + 1
                    dangling.append(f"{path.relative_to(ROOT)}:{line}: {match.group(0)}")
    assert pointers, "no docs/METHOD.md pointers found: the pattern or the file list is wrong"
    assert not dangling, f"pointers to sections docs/METHOD.md lacks (it has {sorted(sections)}):\n" + "\n".join(
        dangling
    )


def test_the_method_page_cites_only_its_own_sections():
    sections = set(method_sections())
    cited = {int(number) for number in re.findall(r"§(\d+)", METHOD.read_text(encoding="utf-8"))}
    assert cited <= sections, f"docs/METHOD.md cites sections it lacks: {sorted(cited - sections)}"


def test_pointer_pattern_reads_every_section_number():
    numbers = [
        re.findall(r"§(\d+)", m.group(1))
        for m in POINTER.finditer("docs/METHOD.md " + SECTION + "5 (and " + SECTION + "4 for")
    ]
    assert numbers == [["5", "4"]]


@pytest.mark.parametrize(
    "text",
    [
        "see " + FORBIDDEN[0] + " " + SECTION + "3",
        "(spec " + SECTION + "4)",
        "reference " + SECTION + "2.2",
        "the spec's " + SECTION + "5",
        FORBIDDEN[1] + ".md",
        "see " + FORBIDDEN[2],
    ],
)
def test_the_check_catches_outside_pointers(text):
    assert any(name in text.lower() for name in FORBIDDEN) or LOOSE_POINTER.search(text)
