"""The faust app's broker credentials, derived from the librdkafka-style Kafka settings.

Every confluent-kafka client takes ``settings.kafka.client_config()`` as it is; faust (aiokafka) needs
a credentials object instead. ``faust_credentials`` maps the same settings onto it, so one set of
variables secures every client, and refuses what aiokafka cannot do, naming the setting, rather than
letting the faust app connect with less security than the other clients.

Supported: PLAINTEXT; SSL (``ssl.ca.location``, ``ssl.certificate.location``, ``ssl.key.location``,
``ssl.key.password``, ``ssl.endpoint.identification.algorithm``,
``enable.ssl.certificate.verification``); SASL_PLAINTEXT and SASL_SSL with ``sasl.mechanism`` PLAIN,
SCRAM-SHA-256 or SCRAM-SHA-512 and ``sasl.username`` / ``sasl.password``.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SSL_KEYS = frozenset({"ssl.ca.location", "ssl.certificate.location", "ssl.key.location", "ssl.key.password",
                      "ssl.endpoint.identification.algorithm", "enable.ssl.certificate.verification"})
SASL_KEYS = frozenset({"sasl.mechanism", "sasl.mechanisms", "sasl.username", "sasl.password"})


class KafkaSecurityError(ValueError):
    """The Kafka security settings ask for something the faust app cannot do; the message names it."""


def _setting(key: str) -> str:
    return f"settings.kafka.extra_client_config[{key!r}]"


def _security_keys(conf: Mapping[str, Any]) -> dict[str, str]:
    """The ``ssl.*`` / ``sasl.*`` settings; any of them faust cannot carry is an error."""
    found = {k: str(v) for k, v in conf.items() if k.startswith(("ssl.", "sasl.")) or k in SSL_KEYS}
    unsupported = sorted(set(found) - SSL_KEYS - SASL_KEYS)
    if unsupported:
        raise KafkaSecurityError(f"{_setting(unsupported[0])} is not supported by the faust app (aiokafka); "
                                 f"supported: {', '.join(sorted(SSL_KEYS | SASL_KEYS))}")
    return found


def ssl_context(conf: Mapping[str, str]) -> ssl.SSLContext:
    """A client TLS context from the librdkafka ``ssl.*`` settings (system CAs unless a CA file is named)."""
    cafile = conf.get("ssl.ca.location")
    # librdkafka's "probe" means the system's CA store, which is Python's default too.
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH,
                                         cafile=cafile if cafile and cafile != "probe" else None)
    if conf.get("ssl.endpoint.identification.algorithm", "https").lower() == "none":
        context.check_hostname = False
    if conf.get("enable.ssl.certificate.verification", "true").lower() == "false":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    cert, key = conf.get("ssl.certificate.location"), conf.get("ssl.key.location")
    if key and not cert:
        raise KafkaSecurityError(f"{_setting('ssl.key.location')} needs {_setting('ssl.certificate.location')}")
    if cert:
        context.load_cert_chain(cert, key or None, conf.get("ssl.key.password") or None)
    return context


def faust_credentials(client_config: Mapping[str, Any]) -> Any:
    """``broker_credentials`` for ``faust.App`` from ``settings.kafka.client_config()``; None for PLAINTEXT."""
    protocol = str(client_config.get("security.protocol", "PLAINTEXT")).upper()
    if protocol not in PROTOCOLS:
        raise KafkaSecurityError(f"settings.kafka.security_protocol {protocol!r} is not one of {', '.join(PROTOCOLS)}")
    conf = _security_keys(client_config)
    sasl = sorted(k for k in conf if k in SASL_KEYS)
    tls = sorted(k for k in conf if k in SSL_KEYS)
    if not protocol.startswith("SASL_") and sasl:
        raise KafkaSecurityError(f"{_setting(sasl[0])} is set but security_protocol is {protocol} (no SASL)")
    if not protocol.endswith("SSL") and tls:
        raise KafkaSecurityError(f"{_setting(tls[0])} is set but security_protocol is {protocol} (no TLS)")
    if protocol == "PLAINTEXT":
        return None

    import faust  # the faust app is the only user; keep it out of every other client's imports

    if protocol == "SSL":
        return faust.SSLCredentials(ssl_context(conf))
    mechanism = (conf.get("sasl.mechanism") or conf.get("sasl.mechanisms") or "GSSAPI").upper()
    if mechanism not in SASL_MECHANISMS:  # librdkafka's default mechanism is GSSAPI
        raise KafkaSecurityError(f"{_setting('sasl.mechanism')} {mechanism!r} is not supported by the faust app; "
                                 f"use one of {', '.join(SASL_MECHANISMS)}")
    for key in ("sasl.username", "sasl.password"):
        if not conf.get(key):
            raise KafkaSecurityError(f"{_setting(key)} is needed for SASL {mechanism}")
    return faust.SASLCredentials(username=conf["sasl.username"], password=conf["sasl.password"],
                                 mechanism=mechanism,
                                 ssl_context=ssl_context(conf) if protocol == "SASL_SSL" else None)
