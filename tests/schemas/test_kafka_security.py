"""Kafka security settings, derived without a broker: librdkafka configs and faust's credentials (a secured
local broker's server.properties: tests/tokentrail/kafka_local/test_broker_config.py).
tests/tokentrail/kafka_local/test_sasl.py runs the same settings against a real SASL broker."""

from __future__ import annotations

import datetime
import ssl
from pathlib import Path

import faust
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from schemas.kafka.config import admin_config, faust_app_settings
from schemas.kafka.faust_security import KafkaSecurityError, faust_credentials
from tokentrail.settings import KafkaSettings, Settings

SASL = {"sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice", "sasl.password": "alice-secret"}


def conf(protocol: str, **extra: str) -> dict[str, str]:
    return KafkaSettings(security_protocol=protocol, extra_client_config=extra).client_config()


def client_certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate and its key (encrypted with 'kp'), as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tokentrail-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "client.pem", tmp_path / "client.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.BestAvailableEncryption(b"kp")))
    return cert_path, key_path


def test_plaintext_has_no_credentials_and_faust_app_settings_carry_them() -> None:
    assert faust_credentials(conf("PLAINTEXT")) is None
    assert faust_app_settings(Settings().kafka)["broker_credentials"] is None
    settings = Settings(kafka=KafkaSettings(security_protocol="SASL_PLAINTEXT", extra_client_config=SASL))
    creds = faust_app_settings(settings.kafka)["broker_credentials"]
    assert isinstance(creds, faust.SASLCredentials)
    assert (creds.username, creds.password, creds.mechanism.value) == ("alice", "alice-secret", "SCRAM-SHA-512")
    assert creds.protocol.value == "SASL_PLAINTEXT" and creds.ssl_context is None


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "scram-sha-512"])
def test_sasl_mechanisms_map_to_sasl_credentials(mechanism: str) -> None:
    creds = faust_credentials(conf("SASL_PLAINTEXT", **{**SASL, "sasl.mechanism": mechanism}))
    assert creds.mechanism.value == mechanism.upper()
    # librdkafka's plural alias is the same setting.
    alias = faust_credentials(conf("SASL_PLAINTEXT", **{"sasl.mechanisms": mechanism, "sasl.username": "u",
                                                        "sasl.password": "p"}))
    assert alias.mechanism.value == mechanism.upper()


def test_sasl_ssl_gets_a_verifying_tls_context_from_the_ca_file() -> None:
    import certifi

    creds = faust_credentials(conf("SASL_SSL", **SASL, **{"ssl.ca.location": certifi.where()}))
    assert creds.protocol.value == "SASL_SSL"
    context = creds.ssl_context
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.cert_store_stats()["x509_ca"] > 10  # the named CA bundle was loaded


def test_ssl_with_a_client_certificate_and_relaxed_hostname_check(tmp_path: Path) -> None:
    cert, key = client_certificate(tmp_path)
    creds = faust_credentials(conf("SSL", **{"ssl.ca.location": str(cert), "ssl.certificate.location": str(cert),
                                             "ssl.key.location": str(key), "ssl.key.password": "kp",
                                             "ssl.endpoint.identification.algorithm": "none"}))
    assert isinstance(creds, faust.SSLCredentials) and creds.protocol.value == "SSL"
    assert creds.context.verify_mode == ssl.CERT_REQUIRED and not creds.context.check_hostname
    with pytest.raises(ssl.SSLError):  # the key password is really used
        faust_credentials(conf("SSL", **{"ssl.certificate.location": str(cert), "ssl.key.location": str(key),
                                         "ssl.key.password": "wrong"}))


@pytest.mark.parametrize(("protocol", "extra", "named"), [
    ("SASL_PLAINTEXT", {**SASL, "sasl.mechanism": "GSSAPI"}, "sasl.mechanism"),
    ("SASL_PLAINTEXT", {"sasl.username": "alice", "sasl.password": "p"}, "sasl.mechanism"),  # GSSAPI default
    ("SASL_SSL", {**SASL, "sasl.mechanism": "OAUTHBEARER"}, "sasl.mechanism"),
    ("SASL_PLAINTEXT", {"sasl.mechanism": "PLAIN", "sasl.username": "alice"}, "sasl.password"),
    ("SASL_PLAINTEXT", {"sasl.mechanism": "PLAIN", "sasl.password": "p"}, "sasl.username"),
    ("SASL_PLAINTEXT", {**SASL, "sasl.kerberos.service.name": "kafka"}, "sasl.kerberos.service.name"),
    ("SSL", {"ssl.keystore.location": "/x.p12"}, "ssl.keystore.location"),
    ("SSL", {"ssl.key.location": "/k.pem"}, "ssl.key.location"),
    ("PLAINTEXT", SASL, "sasl.mechanism"),
    ("SASL_PLAINTEXT", {**SASL, "ssl.ca.location": "/ca.pem"}, "ssl.ca.location"),
    ("SSL", SASL, "sasl.mechanism"),
    ("KERBEROS", {}, "security_protocol"),
])
def test_what_faust_cannot_honour_is_refused_naming_the_setting(protocol: str, extra: dict[str, str],
                                                                 named: str) -> None:
    with pytest.raises(KafkaSecurityError, match=named.replace(".", r"\.")):
        faust_credentials(conf(protocol, **extra))


def test_admin_clients_raise_refused_logins() -> None:
    from confluent_kafka import KafkaError, KafkaException

    callback = admin_config(Settings().kafka)["error_cb"]
    with pytest.raises(KafkaException, match="Authentication failed"):
        callback(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: Authentication failed"))
    callback(KafkaError(KafkaError._TRANSPORT, "connection refused"))  # transient: librdkafka retries


def test_settings_read_security_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENTRAIL_KAFKA__SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("TOKENTRAIL_KAFKA__EXTRA_CLIENT_CONFIG",
                       '{"sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "svc", "sasl.password": "pw"}')
    kafka = Settings().kafka
    assert kafka.client_config()["security.protocol"] == "SASL_SSL"
    assert kafka.client_config()["sasl.username"] == "svc"
    creds = faust_credentials(kafka.client_config())
    assert creds.protocol.value == "SASL_SSL" and creds.mechanism.value == "SCRAM-SHA-256"
