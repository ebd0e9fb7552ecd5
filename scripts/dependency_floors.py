"""Print the lowest version of every runtime dependency (and of the `lora` extra, which `dev` installs too) that
pyproject.toml declares with a floor, one pip constraint a line (`name>=X` becomes `name==X`): what
`.ci/floors_env.sh` installs, so that CI runs the end-to-end tests at the floors as well as at the newest versions.
Dependencies without a floor are left to the resolver.

Usage: python scripts/dependency_floors.py [pyproject.toml]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def runtime_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The strings of `[project] dependencies` (read without tomllib, which Python 3.10 lacks)."""
    block = re.search(r"^dependencies = \[(.*?)^\]", pyproject.read_text(), re.MULTILINE | re.DOTALL)
    return re.findall(r'^\s*"([^"]+)"', block[1], re.MULTILINE)


def extra_requirements(extra: str, pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The strings of one `[project.optional-dependencies]` extra, e.g. `lora`."""
    line = re.search(rf"^{re.escape(extra)} = \[(.*?)\]", pyproject.read_text(), re.MULTILINE)
    return re.findall(r'"([^"]+)"', line[1]) if line else []


# extras whose code the floors' tests run (dev installs them too): their floors are tested like the runtime ones
FLOORED_EXTRAS = ("lora",)


def dependency_floors(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    """{distribution name: its `>=` bound} for `[project] dependencies` and the `FLOORED_EXTRAS`, in declaration
    order."""
    floors = {}
    extras = [r for extra in FLOORED_EXTRAS for r in extra_requirements(extra, pyproject)]
    for requirement in [*runtime_requirements(pyproject), *extras]:
        name, specifiers = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)", requirement).groups()
        floor = re.search(r">=\s*([0-9][^,;\s]*)", specifiers)
        if floor:
            floors[name] = floor[1]
    return floors


def main(argv: list[str]) -> None:
    pyproject = Path(argv[0]) if argv else ROOT / "pyproject.toml"
    for name, version in dependency_floors(pyproject).items():
        print(f"{name}=={version}")


if __name__ == "__main__":
    main(sys.argv[1:])
