"""The residue scan across every store: does anything readable of the forgotten subjects remain?

Composes the adapters (Kafka topics, the gateway's spool, ClickHouse, the HTML reports) around one
``schemas.residue.Matcher`` and one ``Tally``. Used by ``tokentrail scan-residue`` and by the demo after
its forgets; a caller that already holds the chDB client (chDB allows one process per directory, so a
running sink's process must scan through its own client) passes it in.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from clickhouse_connect.driver.client import Client

from producers.delivery.residue import scan_spool
from schemas.codec import get_codec
from schemas.kafka.residue import TopicSelection, scan_topics
from schemas.residue import Matcher, Needles, Tally, Unsealer, record_decoder
from sinks.client import connect
from sinks.residue import scan_clickhouse
from tokentrail.settings import Settings, get_settings

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ScanTargets:
    """Which stores to scan; ``None`` paths mean the settings' defaults."""

    kafka: bool = True
    topics: TopicSelection = field(default_factory=TopicSelection)
    kafka_timeout_s: float = 600.0
    spool: bool = True
    spool_dirs: tuple[Path, ...] | None = None  # default: the gateway's spool_dir (every worker's spool under it)
    clickhouse: bool = True
    dsn: str | None = None
    database: str | None = None
    reports: tuple[Path, ...] | None = None  # default: every *.html under var_dir
    paths: tuple[Path, ...] = ()  # further files or folders searched raw (local caches, exports, copies)


def _files_under(path: Path, suffix: str = "") -> list[Path]:
    if path.is_file():
        return [path]
    found: list[Path] = []
    for folder, _dirs, names in os.walk(path):
        found += [Path(folder) / n for n in sorted(names) if n.endswith(suffix)]
    return found


def default_reports(var_dir: Path) -> tuple[Path, ...]:
    """Every HTML file under ``var_dir``: ``tokentrail report`` and the demos write their reports there."""
    return tuple(_files_under(var_dir, ".html"))


def scan_files(paths: tuple[Path, ...], store: str, matcher: Matcher, tally: Tally) -> None:
    """Every file (under every folder) of ``paths`` as raw bytes: the reports (the matcher knows the
    HTML-escaped form of a canary), and any further path. A path that does not exist is noted as skipped."""
    for path in paths:
        if not path.exists():
            tally.skipped.append(f"{store} {path} (does not exist)")
            continue
        for file in _files_under(path):
            try:
                data = file.read_bytes()
            except OSError as exc:
                tally.incomplete.append(f"{store} {file}: {exc}")
                continue
            tally.count(f"{store}_files")
            tally.add(store, str(file), matcher.in_bytes(data, "file"))


def scan_residue(needles: Needles, targets: ScanTargets = ScanTargets(), *, settings: Settings | None = None,
                 client: Client | None = None, unseal: Unsealer | None = None,
                 progress: Progress | None = None) -> Tally:
    """Scan the targets for the needles; the tally says where readable content remains, and whether every
    store was read to its end. ``unseal`` opens sealed content with every data key still in the key store:
    given it, content sealed under a key that was not destroyed counts as readable."""
    settings = settings or get_settings()
    matcher = Matcher(needles, record_decoder(get_codec()), unseal)
    tally = Tally()
    if targets.kafka:
        scan_topics(settings.kafka, matcher, tally, selection=targets.topics, timeout_s=targets.kafka_timeout_s,
                    progress=progress)
    if targets.spool:
        scan_spool(targets.spool_dirs or (settings.gateway.spool_dir,), matcher, tally, progress=progress)
    if targets.clickhouse:
        ch = client or connect(settings.clickhouse, dsn=targets.dsn, database=targets.database)
        scan_clickhouse(ch, matcher, tally, database=targets.database or ch.database, progress=progress)
    reports = targets.reports if targets.reports is not None else default_reports(settings.var_dir)
    scan_files(reports, "report", matcher, tally)
    scan_files(targets.paths, "file", matcher, tally)
    if progress:
        progress(f"reports: {len(reports)} files; other paths: {tally.scanned['file_files']} files")
    return tally
