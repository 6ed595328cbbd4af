"""Forgetting in this process: install the content sealer backed by the key store of record when
``forget.enabled`` (docs/forgetting.md). Every CLI command calls ``install_from_settings`` once, so the
gateway, the processors, the sink, the trainer, replay and audit all seal and open the same way."""

from __future__ import annotations

import logging

from schemas.codec import install_sealer, process_sealer
from schemas.kafka.key_store import ForgetSettings, KafkaKeyStore
from schemas.sealing import Sealer
from tokentrail.settings import Settings, get_settings

log = logging.getLogger("tokentrail.forget")


def install(settings: Settings) -> KafkaKeyStore | None:
    """The key store now sealing and opening this process's records; None when forgetting is off."""
    if not settings.forget.enabled:
        return None
    store = KafkaKeyStore(settings.kafka, settings.forget)
    install_sealer(Sealer(store))
    if settings.forget.uses_dev_master_key():
        log.warning("forget: content is sealed under the DEV-ONLY master key; set TOKENTRAIL_FORGET__MASTER_KEY")
    return store


def install_from_settings() -> KafkaKeyStore | None:
    current = process_sealer()
    if current is not None and isinstance(current.keyring, KafkaKeyStore):
        return current.keyring  # installed already (a command that runs another in-process)
    return install(get_settings())


def forget_settings() -> ForgetSettings:
    return get_settings().forget
