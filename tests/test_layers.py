"""The structure stays true: every import in the tree points down a layer, no modules import each other in
a circle, and neither the contract nor the pure core imports I/O.

The layers are read from the tables in docs/architecture.md, so the document and this test cannot
drift apart. Every import counts, also one inside a function or under ``TYPE_CHECKING``. A path the
table names that does not exist (yet) checks nothing, so the table may name packages before they land.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"
# Libraries that talk to the outside world (brokers, databases, HTTP, processes, sockets): none of them
# in the contract or the pure core.
IO_LIBRARIES = frozenset({"confluent_kafka", "faust", "aiokafka", "clickhouse_connect", "chdb", "httpx",
                          "starlette", "fastapi", "uvicorn", "requests", "aiohttp", "socket", "ssl", "selectors",
                          "subprocess", "multiprocessing", "openai", "anthropic", "vllm"})
# The contract and the pure core, and the plumbing beside each that may do I/O.
NO_IO = {"schemas": ("schemas/kafka",), "processors": ("processors/stream", "processors/isolation")}

# Imports that point up and are being moved by issue 27, as (importing path, imported path) of the layer
# table. Shrink-only: the test fails on any upward import not listed here; the lead removes an entry
# once the branch that moves it is merged (an entry that no longer occurs fails nothing).
KNOWN_UPWARD: dict[tuple[str, str], str] = {}
# Import cycles being broken by issue 27, each as the set of modules in it. Shrink-only, as above: a
# cycle passes only when all its modules are one listed set.
KNOWN_CYCLES: dict[frozenset[str], str] = {}


def _table(header: str) -> list[list[str]]:
    """The rows (cells stripped) of the markdown table under ``header`` in docs/architecture.md."""
    text = ARCHITECTURE.read_text()
    assert header in text, f"docs/architecture.md has no table {header!r}"
    lines = text.split(header, 1)[1].split("\n\n", 1)[0].strip().splitlines()[1:]  # below the --- row
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines]


def _names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _top(name: str) -> str:
    return name.split("/")[0]


def packages() -> set[str]:
    return {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}


def layer_rows() -> list[tuple[int, list[str], list[str]]]:
    """(layer, paths, paths it may import besides the layers below) per row of the layer table."""
    return [(layer, _names(paths), _names(may_import))
            for layer, (_title, paths, may_import) in enumerate(_table("| layer | packages | may import |"))]


def layer_table() -> dict[str, set[str]]:
    """path (``schemas/``, ``processors/stream/``, ``tokentrail/cli.py``) -> the paths it may import:
    those of the rows above its own, those its row names, and itself."""
    allowed: dict[str, set[str]] = {}
    below: set[str] = set()
    for _layer, paths, may_import in layer_rows():
        for path in paths:
            allowed[path] = below | set(may_import) | {path}
        below |= set(paths)
    return allowed


def owner(path: str, table: dict[str, set[str]]) -> str | None:
    """The most specific path of the table that holds ``path`` (a file path relative to the root)."""
    holders = [p for p in table if path == p or (p.endswith("/") and path.startswith(p))]
    return max(holders, key=len, default=None)


def documented_imports() -> dict[str, set[str]]:
    rows = _table("| package | imports |")
    return {_names(package)[0].rstrip("/"): set(_names(imports)) for package, imports in rows}


def pure_core() -> list[str]:
    """Module paths in the ``pure core (no I/O)`` column of the same document."""
    return [path for core, _shell in _table("| pure core (no I/O) | shell around it |") for path in _names(core)]


# ---------------------------------------------------------------- the module graph


@cache
def modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the tree's packages (a package is its ``__init__``)."""
    found: dict[str, Path] = {}
    for package in sorted(packages()):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def imports_of(path: Path) -> Iterator[tuple[int, str]]:
    """(line, top-level module) of every absolute import in the file."""
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


def imported_names(module: str, path: Path) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of everything the module imports, relative imports resolved, each name of a
    ``from`` import as ``module.name`` (so that ``from pkg import submodule`` names the submodule)."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module.split(".") if is_package else module.split(".")[:-1]
                parent = parent[:len(parent) - (node.level - 1)]
                base = ".".join([*parent, base] if base else parent)
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}" if base else alias.name


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest module of the tree that ``name`` starts with (``schemas.codec.Codec`` -> ``schemas.codec``)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


@cache
def module_graph() -> dict[str, frozenset[str]]:
    """module -> the modules of the tree it imports, wherever the import statement is."""
    known = modules()
    graph: dict[str, frozenset[str]] = {}
    for module, path in known.items():
        targets = {_resolve(name, known) for _, name in imported_names(module, path)}
        graph[module] = frozenset(t for t in targets if t and t != module)
    return graph


def cycles(graph: dict[str, frozenset[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            child = next((e for e in edges if e in graph), None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def a_cycle(group: list[str], graph: dict[str, frozenset[str]]) -> list[str]:
    """One circle through the group's first module, for the message: a -> b -> a."""
    members = set(group)
    path = [group[0]]
    seen = {group[0]}
    while True:
        step = sorted(graph[path[-1]] & members)
        back = [m for m in step if m == group[0]]
        if back and len(path) > 1:
            return [*path, group[0]]
        fresh = [m for m in step if m not in seen] or step
        path.append(fresh[0])
        if fresh[0] in seen:
            return path
        seen.add(fresh[0])


# ---------------------------------------------------------------- the tests


def test_the_layer_table_names_every_package() -> None:
    allowed = layer_table()
    named = {_top(path) for path in allowed}
    assert packages() <= named, f"packages missing from docs/architecture.md: {packages() - named}"
    assert allowed["schemas/"] == {"schemas/"}
    assert allowed["processors/"] == {"schemas/", "processors/"}
    for component in ("producers/", "processors/stream/", "sinks/", "trainer_consumer/", "models/"):
        assert not {p for p in allowed[component] if p.startswith("tokentrail/")}, component
    entry = {"tokentrail/cli.py", "tokentrail/__main__.py", "tokentrail/commands/"}  # only the tests import the entry
    assert not entry & {p for path, may in allowed.items() if path not in entry | {"tests/"} for p in may}


def test_the_documented_import_table_matches_the_code() -> None:
    ours = packages()
    documented = {package: imports & ours for package, imports in documented_imports().items() if package in ours}
    actual: dict[str, set[str]] = {package: set() for package in ours}
    for module, path in modules().items():
        actual[_top(module.replace(".", "/"))] |= {_top(m.replace(".", "/")) for _, m in imports_of(path)} & ours
    assert documented == {package: imports - {package} for package, imports in actual.items()}


def test_every_import_points_down_a_layer() -> None:
    allowed = layer_table()
    upward: list[str] = []
    for module, path in modules().items():
        here = owner(str(path.relative_to(ROOT)), allowed)
        if here is None:
            continue
        for line, name in imported_names(module, path):
            target = _resolve(name, modules())
            if target is None:
                continue
            there = owner(str(modules()[target].relative_to(ROOT)), allowed)
            if there is not None and there not in allowed[here] and (here, there) not in KNOWN_UPWARD:
                upward.append(f"{path.relative_to(ROOT)}:{line} ({here}) imports {target} ({there})")
    assert not upward, "imports that point up a layer:\n" + "\n".join(upward)


def test_no_modules_import_each_other_in_a_circle() -> None:
    graph = module_graph()
    new = [group for group in cycles(graph) if frozenset(group) not in KNOWN_CYCLES]
    assert not new, "import cycles (function-level imports included):\n" + "\n".join(
        " -> ".join(a_cycle(group, graph)) for group in new)


def test_commands_are_registered_only_by_the_shell() -> None:
    """Command-line parsing and registration live in tokentrail/ (issue 16); the libraries take values."""
    below = [p for p in ROOT.iterdir() if (p / "__init__.py").exists()
             and p.name not in ("tokentrail", "bench", "demo", "reliability", "tests")]
    found = [f"{path.relative_to(ROOT)}:{line}" for package in below for path in sorted(package.rglob("*.py"))
             for line, module in imports_of(path) if module == "argparse"]
    assert not found, "argparse below the shell:\n" + "\n".join(found)


def test_the_pure_core_does_no_io() -> None:
    modules_named = pure_core()
    assert len(modules_named) >= 10, modules_named
    found: list[str] = []
    for entry in modules_named:
        target = ROOT / entry
        assert target.exists(), f"docs/architecture.md names {entry}, which does not exist"
        for path in sorted(target.rglob("*.py")) if target.is_dir() else [target]:
            for line, module in imports_of(path):
                if module.split(".")[0] in IO_LIBRARIES or module.startswith("processors.stream"):
                    found.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not found, "the pure core imports I/O:\n" + "\n".join(found)


@pytest.mark.parametrize("package", sorted(NO_IO))
def test_the_contract_and_the_pure_core_import_no_io_library(package: str) -> None:
    """All of ``schemas/`` and ``processors/`` but their plumbing, not only the modules the table lists."""
    plumbing = tuple(ROOT / p for p in NO_IO[package])
    found = [f"{path.relative_to(ROOT)}:{line} imports {module}"
             for path in sorted((ROOT / package).rglob("*.py")) if not any(path.is_relative_to(p) for p in plumbing)
             for line, module in imports_of(path) if module.split(".")[0] in IO_LIBRARIES]
    assert not found, f"{package}/ imports I/O outside {', '.join(NO_IO[package])}:\n" + "\n".join(found)


@pytest.mark.parametrize("source, expected", [
    ("import schemas.codec\n", [(1, "schemas.codec")]),
    ("def f():\n    from tokentrail.settings import get_settings\n", [(2, "tokentrail.settings")]),
    ("from . import sibling\nfrom .x import y\n", []),
])
def test_imports_are_found_wherever_they_are(tmp_path: Path, source: str, expected: list[tuple[int, str]]) -> None:
    path = tmp_path / "module.py"
    path.write_text(source)
    assert list(imports_of(path)) == expected


@pytest.mark.parametrize("source, expected", [
    ("from . import sibling\n", [(1, "pkg.sibling")]),
    ("from .x import y\n", [(1, "pkg.x.y")]),
    ("from .. import up\n", [(1, "up")]),
    ("def f():\n    from schemas import codec\n", [(2, "schemas.codec")]),
])
def test_relative_and_function_level_imports_name_the_module(tmp_path: Path, source: str,
                                                             expected: list[tuple[int, str]]) -> None:
    path = tmp_path / "module.py"
    path.write_text(source)
    assert list(imported_names("pkg.module", path)) == expected


def test_a_circle_through_a_function_level_import_is_found() -> None:
    graph = {"a.one": frozenset({"a.two"}), "a.two": frozenset({"a.three"}), "a.three": frozenset({"a.one"}),
             "a.four": frozenset({"a.one"})}
    assert cycles(graph) == [["a.one", "a.three", "a.two"]]
    assert a_cycle(["a.one", "a.three", "a.two"], graph) == ["a.one", "a.two", "a.three", "a.one"]
    assert cycles({"a": frozenset({"b"}), "b": frozenset()}) == []


def test_a_module_belongs_to_the_most_specific_path_of_the_table() -> None:
    table = layer_table()
    assert owner("processors/stream/app.py", table) == "processors/stream/"
    assert owner("processors/pipeline.py", table) == "processors/"
    assert owner("schemas/kafka/config.py", table) == "schemas/kafka/"
    assert owner("tokentrail/cli.py", table) == "tokentrail/cli.py"
    assert owner("tokentrail/settings.py", table) == "tokentrail/"
