"""Forgetting (docs/forgetting.md). In this process: install the content sealer backed by the key store of
record when ``forget.enabled``; every CLI command calls ``install_from_settings`` once, so the gateway, the
processors, the sink, the trainer, replay and audit all seal and open the same way. And ``forget``, what
``tokentrail forget`` does: keys destroyed and the Forgotten event recorded (directly or through a gateway's
admin route), ClickHouse blanked, then the key topic's refresh time waited out."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from schemas.codec import Codec, get_codec, install_sealer, process_sealer
from schemas.kafka.key_store import ForgetSettings, KafkaKeyStore
from schemas.sealing import Sealer
from tokentrail.errors import CliError
from tokentrail.settings import Settings, get_settings

log = logging.getLogger("tokentrail.forget")


def install(settings: Settings) -> KafkaKeyStore | None:
    """The key store now sealing and opening this process's records; None when forgetting is off."""
    if not settings.forget.enabled:
        return None
    store = KafkaKeyStore(settings.kafka, settings.forget)  # warns on first use if under the dev master key
    install_sealer(Sealer(store))
    return store


def uninstall() -> None:
    """No sealer in this process any more; the key store it had is closed (before its broker stops)."""
    previous = install_sealer(None)
    if previous is not None and isinstance(previous.keyring, KafkaKeyStore):
        previous.keyring.close()


def reinstall(settings: Settings) -> KafkaKeyStore | None:
    """``install`` for ``settings`` in place of what this process installed for other settings (a demo that
    switches to a broker of its own after the command started)."""
    uninstall()
    return install(settings)


def install_from_settings() -> KafkaKeyStore | None:
    current = process_sealer()
    if current is not None and isinstance(current.keyring, KafkaKeyStore):
        return current.keyring  # installed already (a command that runs another in-process)
    return install(get_settings())


@contextmanager
def content_codec(settings: Settings) -> Iterator[Codec]:
    """A codec that opens subjects' content as the deployment's processes do (a checker reading what they
    wrote): the process's sealer when one is installed, else one on ``settings``' key store, closed after."""
    if process_sealer() is not None or not settings.forget.enabled:
        yield get_codec()
        return
    store = KafkaKeyStore(settings.kafka, settings.forget)
    try:
        yield Codec(sealer=Sealer(store))
    finally:
        store.close()


def forget_settings() -> ForgetSettings:
    return get_settings().forget


@contextmanager
def _key_store(settings: Settings) -> Iterator[KafkaKeyStore]:
    """The process's key store (its cache forgets at once), else one of this call's own, closed after (its
    re-reading thread stops)."""
    sealer = process_sealer()
    if sealer is not None and isinstance(sealer.keyring, KafkaKeyStore):
        yield sealer.keyring
        return
    store = KafkaKeyStore(settings.kafka, settings.forget)
    try:
        yield store
    finally:
        store.close()


def _via_gateway(url: str, admin_key: str, body: dict[str, Any]) -> dict[str, Any]:
    import httpx

    headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
    response = httpx.post(url.rstrip("/") + "/v1/admin/forget", json=body, headers=headers, timeout=120)
    if response.status_code != 200:
        raise CliError(f"the gateway refused the forget: HTTP {response.status_code} {response.text[:500]}")
    return dict(response.json())


def forget(settings: Settings, subjects: list[str], *, requested_by: str, reason: str = "",
           gateway: str | None = None, clickhouse: bool = True, dsn: str | None = None,
           database: str | None = None, wait: bool = True, progress: Any = print) -> dict[str, Any]:
    """Forget every subject; the summary (also what the demo calls)."""
    # Here, not at the top: every command imports this module to install the sealer, few forget.
    from schemas.forget_events import new_request_id
    from schemas.kafka.forget_log import forget_name
    from schemas.subject_names import SubjectNames
    from sinks.client import ClickHouseConfigError, connect
    from sinks.forget import blank_subject, versions_trained_on

    # Records carry a subject's pseudonym (older ones its name): every form is forgotten (subject_names.py).
    forms = {subject: SubjectNames(settings.forget.master()).forms(subject) for subject in subjects}
    events = []
    for subject in subjects:
        request_id = new_request_id()
        progress(f"forget: {subject!r} (stored as {forms[subject][0]}): destroying its keys and recording "
                 f"request {request_id}")
        if gateway:
            answer = _via_gateway(gateway, settings.gateway.admin_key, {
                "subject": subject, "requested_by": requested_by, "reason": reason, "request_id": request_id})
            done = [answer, *answer.get("also_forgotten", [])]
        else:
            with _key_store(settings) as store:
                done = forget_name(store, settings.kafka, settings.forget, subject,
                                   requested_by=requested_by, reason=reason, request_id=request_id)
        progress(f"forget: {subject!r}: {sum(len(e['key_ids']) for e in done)} key(s) destroyed")
        events += done
    blanked: dict[str, int] = {}
    trained: dict[str, list[int]] = {}
    if clickhouse:
        try:
            client = connect(settings.clickhouse, dsn=dsn, database=database)
        except ClickHouseConfigError as exc:
            raise CliError(str(exc)) from exc
        for subject in subjects:
            trained[subject] = sorted({v for form in forms[subject] for v in versions_trained_on(client, form)})
            if trained[subject]:
                progress(f"forget: {subject!r}: policy versions {trained[subject]} trained on its samples; a forget "
                         "does not unlearn them (docs/forgetting.md)")
            for form in forms[subject]:
                for table, rows in blank_subject(client, form).items():
                    blanked[table] = blanked.get(table, 0) + rows
            progress(f"forget: {subject!r}: content blanked in ClickHouse ({sum(blanked.values())} rows so far)")
    if wait:
        progress(f"forget: waiting {settings.forget.refresh_s:.1f} s for every process to re-read the key topic")
        time.sleep(settings.forget.refresh_s + 0.5)
    return {"subjects": subjects, "stored_subjects": {s: list(f) for s, f in forms.items()},
            "requests": [e["request_id"] for e in events],
            "keys_destroyed": sum(len(e["key_ids"]) for e in events), "clickhouse_rows_blanked": blanked,
            "sealing_enabled": settings.forget.enabled, "policy_versions_trained_on": trained}


def expire(settings: Settings, *, clickhouse: bool = True, dsn: str | None = None, database: str | None = None,
           progress: Any = print) -> dict[str, Any]:
    """Retention of raw content: destroy the data keys whose time ran out (their content on every topic and
    backup with them) and blank ClickHouse content past its retention; non-content facts stay."""
    from sinks.client import ClickHouseConfigError, connect
    from sinks.forget import blank_expired

    f = settings.forget
    with _key_store(settings) as store:
        expired = store.expire()
    progress(f"retention: {len(expired)} data key(s) past their retention destroyed")
    mutations = 0
    if clickhouse:
        try:
            client = connect(settings.clickhouse, dsn=dsn, database=database)
        except ClickHouseConfigError as exc:
            raise CliError(str(exc)) from exc
        mutations = blank_expired(client, f.content_retention_days, dict(f.tenant_retention_days))
        progress(f"retention: ClickHouse content past retention blanked ({mutations} tables swept)")
    return {"keys_expired": expired, "clickhouse_tables_swept": mutations,
            "content_retention_days": f.content_retention_days, "tenant_retention_days": f.tenant_retention_days}
