"""The structure stays true: every import in the tree points down a layer, and the pure core imports no I/O.

The layers are read from the table in docs/architecture.md, so the document and this test cannot
drift apart. Every import counts, also one inside a function or under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"
# Libraries that talk to the outside world: none of them in the pure core.
IO_LIBRARIES = frozenset({"confluent_kafka", "faust", "aiokafka", "clickhouse_connect", "chdb", "httpx",
                          "starlette", "fastapi", "uvicorn", "requests", "socket", "subprocess"})


def _table(header: str) -> list[list[str]]:
    """The rows (cells stripped) of the markdown table under ``header`` in docs/architecture.md."""
    text = ARCHITECTURE.read_text()
    assert header in text, f"docs/architecture.md has no table {header!r}"
    lines = text.split(header, 1)[1].split("\n\n", 1)[0].strip().splitlines()[1:]  # below the --- row
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines]


def _names(cell: str) -> list[str]:
    return [name.rstrip("/") for name in re.findall(r"`([^`]+)`", cell)]


def layer_table() -> dict[str, set[str]]:
    """package -> the packages it may import: those of the rows above its own, and those its row names."""
    allowed: dict[str, set[str]] = {}
    below: set[str] = set()
    for _layer, packages_cell, may_import_cell in _table("| layer | packages | may import |"):
        packages = set(_names(packages_cell))
        for package in packages:
            allowed[package] = below | set(_names(may_import_cell)) | {package}
        below |= packages
    return allowed


def documented_imports() -> dict[str, set[str]]:
    return {_names(package)[0]: set(_names(imports)) for package, imports in _table("| package | imports |")}


def pure_core() -> list[str]:
    """Module paths in the ``pure core (no I/O)`` column of the same document."""
    return [path for core, _shell in _table("| pure core (no I/O) | shell around it |") for path in _names(core)]


def actual_imports() -> dict[str, set[str]]:
    """package -> the other packages of this tree that it imports."""
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    found: dict[str, set[str]] = {package: set() for package in packages}
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            found[package] |= {m.split(".")[0] for _, m in imports_of(path)} & (packages - {package})
    return found


def imports_of(path: Path) -> Iterator[tuple[int, str]]:
    """(line, top-level module) of every absolute import in the file."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


def test_the_layer_table_names_every_package() -> None:
    allowed = layer_table()
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert packages <= set(allowed), f"packages missing from docs/architecture.md: {packages - set(allowed)}"
    assert allowed["schemas"] == {"schemas"}
    assert "tokentrail" not in allowed["producers"] | allowed["processors"] | allowed["sinks"]


def test_the_documented_import_table_matches_the_code() -> None:
    assert documented_imports() == actual_imports()


def test_every_import_points_down_a_layer() -> None:
    allowed = layer_table()
    ours = set(allowed)
    upward: list[str] = []
    for package, may_import in allowed.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, module in imports_of(path):
                top = module.split(".")[0]
                if top in ours and top not in may_import:
                    upward.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not upward, "imports that point up a layer:\n" + "\n".join(upward)


def test_commands_are_registered_only_by_the_shell() -> None:
    """Command-line parsing and registration live in tokentrail/ (issue 16); the libraries take values."""
    below = [p for p in ROOT.iterdir() if (p / "__init__.py").exists()
             and p.name not in ("tokentrail", "bench", "demo", "reliability", "tests")]
    found = [f"{path.relative_to(ROOT)}:{line}" for package in below for path in sorted(package.rglob("*.py"))
             for line, module in imports_of(path) if module == "argparse"]
    assert not found, "argparse below the shell:\n" + "\n".join(found)


def test_the_pure_core_does_no_io() -> None:
    modules = pure_core()
    assert len(modules) >= 10, modules
    found: list[str] = []
    for entry in modules:
        target = ROOT / entry
        assert target.exists(), f"docs/architecture.md names {entry}, which does not exist"
        for path in sorted(target.rglob("*.py")) if target.is_dir() else [target]:
            for line, module in imports_of(path):
                if module.split(".")[0] in IO_LIBRARIES or module.startswith("processors.stream"):
                    found.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not found, "the pure core imports I/O:\n" + "\n".join(found)


@pytest.mark.parametrize("source, expected", [
    ("import schemas.codec\n", [(1, "schemas.codec")]),
    ("def f():\n    from tokentrail.settings import get_settings\n", [(2, "tokentrail.settings")]),
    ("from . import sibling\nfrom .x import y\n", []),
])
def test_imports_are_found_wherever_they_are(tmp_path: Path, source: str, expected: list[tuple[int, str]]) -> None:
    path = tmp_path / "module.py"
    path.write_text(source)
    assert list(imports_of(path)) == expected
