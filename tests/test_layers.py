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


def layer_table() -> dict[str, set[str]]:
    """package -> the packages it may import, from the ``| layer | packages | may import |`` table."""
    text = ARCHITECTURE.read_text()
    rows = re.findall(r"^\|\s*\d+[^|]*\|([^|]+)\|([^|]+)\|\s*$", text.split("| layer | packages | may import |")[1],
                      re.M)
    allowed: dict[str, set[str]] = {}
    below: set[str] = set()
    for packages_cell, may_import_cell in rows:
        packages = set(re.findall(r"`([\w/]+)/?`", packages_cell))
        extra = set(re.findall(r"`([\w/]+)/?`", may_import_cell))
        for package in packages:
            allowed[package] = below | extra | {package}
        below = below | packages
    return allowed


def pure_core() -> list[str]:
    """Module paths of the pure core, from the ``pure core (no I/O)`` column of the same document."""
    text = ARCHITECTURE.read_text()
    table = text.split("| pure core (no I/O) | shell around it |")[1].split("\n\n")[0]
    paths: list[str] = []
    for line in table.splitlines()[2:]:
        cell = line.split("|")[1]
        for stem, names in re.findall(r"`([\w/]+/)([^`]*)`", cell):
            paths += [stem + name.strip() for name in names.split(",")] if names else [stem]
        for name in re.findall(r"(?<![/\w`])`([\w.]+\.py)`", cell):
            paths.append(name)
    return paths


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
