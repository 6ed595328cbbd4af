"""Training text for the harness tokenizer: what real agent harnesses send (the captured requests of Claude Code,
Codex CLI, Pi and OpenClaw: system prompts in English, JSON schemas of their tools, tool output) and Python
sources with their docstrings (code, prose, doctest and shell-like output).

Only files that stay fixed for a checkout and a Python build are read (the captured requests are committed;
the standard library is the interpreter's own), so the same spec trains the same tokenizer. The text is
yielded in a sorted, deduplicated order; its sha256 goes into the build manifest.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CAPTURED_DIR = Path(__file__).resolve().parents[2] / "tests" / "harnesses" / "captured"
# Standard-library modules with much prose, argument parsing, JSON, shell and subprocess handling.
STDLIB_MODULES = ("argparse.py", "subprocess.py", "shutil.py", "pathlib/__init__.py", "pathlib/_local.py",
                  "json/__init__.py", "json/decoder.py", "json/encoder.py", "textwrap.py", "shlex.py",
                  "logging/__init__.py", "http/server.py", "http/client.py", "urllib/parse.py", "difflib.py",
                  "tempfile.py", "os.py", "glob.py", "fnmatch.py", "inspect.py", "typing.py", "dataclasses.py",
                  "asyncio/subprocess.py", "asyncio/tasks.py", "unittest/case.py", "doctest.py", "pdb.py",
                  "tarfile.py", "zipfile/__init__.py", "email/message.py", "csv.py", "string.py")


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _captured_texts(captured_dir: Path) -> Iterator[str]:
    if not captured_dir.is_dir():
        raise FileNotFoundError(f"the harness corpus needs the captured requests in {captured_dir}")
    for path in sorted(captured_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            body = json.loads(line).get("body")
            if not isinstance(body, dict):
                continue
            yield from _strings(body)  # prompts, messages, tool descriptions, tool output
            for key in ("tools", "input"):  # tool schemas as the JSON they are rendered as
                if key in body:
                    yield json.dumps(body[key], ensure_ascii=False)
    for path in sorted(captured_dir.glob("*.out.txt")):
        yield path.read_text()


def _stdlib_texts() -> Iterator[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    for name in STDLIB_MODULES:
        path = root / name
        if path.is_file():
            yield path.read_text(errors="replace")


def harness_texts(captured_dir: Path = CAPTURED_DIR) -> list[str]:
    """The corpus: distinct texts, sorted, so the order never depends on the file system."""
    return sorted({text for text in (*_captured_texts(captured_dir), *_stdlib_texts()) if text.strip()})


def corpus_sha256(texts: list[str]) -> str:
    digest = hashlib.sha256()
    for text in texts:
        digest.update(hashlib.sha256(text.encode()).digest())
    return digest.hexdigest()
