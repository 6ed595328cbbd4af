"""The local broker's configuration, derived from settings (no broker needed)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from tokentrail import kafka_local
from tokentrail.settings import KafkaSettings


def test_overrides_follow_settings(tmp_path: Path) -> None:
    kafka = KafkaSettings(bootstrap_servers="127.0.0.1:19092", controller_port=19093, data_dir=tmp_path,
                          max_message_bytes=5_000_000)
    overrides = kafka_local.broker_overrides(kafka)
    assert overrides["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert overrides["controller.quorum.bootstrap.servers"] == "127.0.0.1:19093"
    assert overrides["log.dirs"] == str(tmp_path / "data")
    assert overrides["message.max.bytes"] == "5000000"


def test_render_replaces_keys_keeps_comments_and_appends_new_ones() -> None:
    template = "# log.dirs=commented\nlog.dirs=old\nnode.id=1\n"
    rendered = kafka_local.render_server_properties(template, {"log.dirs": "/new", "extra.key": "v"})
    assert rendered.splitlines() == ["# log.dirs=commented", "log.dirs=/new", "node.id=1", "extra.key=v"]


def test_template_declares_every_overridden_key() -> None:
    """Each key settings decide exists in deploy/kafka/server.properties, so the file documents it."""
    keys = {line.split("=", 1)[0] for line in kafka_local.SERVER_TEMPLATE.read_text().splitlines()
            if "=" in line and not line.startswith("#")}
    missing = set(kafka_local.broker_overrides(KafkaSettings())) - keys
    assert not missing


def test_cluster_id_is_a_base64url_uuid() -> None:
    for _ in range(200):
        cid = kafka_local.new_cluster_id()
        assert len(cid) == 22 and not cid.startswith("-")
        assert len(base64.urlsafe_b64decode(cid + "==")) == 16


def test_two_versions_of_one_artifact_are_found(tmp_path: Path) -> None:
    jars = ("log4j-core-2.24.3.jar", "log4j-core-2.25.5.jar", "kafka_2.13-4.4.0.jar", "zstd-jni-1.5.7-17.jar")
    for name in jars:
        (tmp_path / name).touch()
    assert kafka_local.duplicate_artifacts(tmp_path) == {"log4j-core": ["2.24.3", "2.25.5"]}
    kafka = KafkaSettings(lib_dir=tmp_path)
    with pytest.raises(kafka_local.KafkaLocalError, match="two versions of log4j-core"):
        kafka_local.ensure_jars(kafka, echo=lambda _: None)


def test_fetched_classpath_has_one_version_of_each_artifact() -> None:
    assert kafka_local.duplicate_artifacts(KafkaSettings().lib_dir) == {}


def test_a_secured_broker_listener_follows_the_security_protocol(tmp_path: Path) -> None:
    users = {"broker": "b-secret", "alice": "a-secret"}
    kafka = KafkaSettings(bootstrap_servers="127.0.0.1:19092", controller_port=19093, data_dir=tmp_path,
                          security_protocol="SASL_PLAINTEXT",
                          broker_properties=kafka_local.plain_sasl_broker_properties(users, "broker"))
    overrides = kafka_local.broker_overrides(kafka)
    assert overrides["listeners"] == "SASL_PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert overrides["listener.security.protocol.map"] == "CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT"
    assert overrides["inter.broker.listener.name"] == "SASL_PLAINTEXT"
    assert overrides["sasl.mechanism.inter.broker.protocol"] == "PLAIN"
    jaas = overrides["listener.name.sasl_plaintext.plain.sasl.jaas.config"]
    assert jaas.startswith("org.apache.kafka.common.security.plain.PlainLoginModule required ")
    assert 'username="broker" password="b-secret"' in jaas and 'user_alice="a-secret"' in jaas
    assert jaas.endswith(";")
    # broker_properties come last: they may replace a derived key.
    replaced = kafka.model_copy(update={"broker_properties": {"message.max.bytes": "1000"}})
    assert kafka_local.broker_overrides(replaced)["message.max.bytes"] == "1000"
    rendered = kafka_local.render_server_properties(kafka_local.SERVER_TEMPLATE.read_text(), overrides)
    assert "inter.broker.listener.name=SASL_PLAINTEXT" in rendered.splitlines()
    assert "inter.broker.listener.name=PLAINTEXT" not in rendered.splitlines()


def test_broker_property_helpers_refuse_bad_input() -> None:
    with pytest.raises(kafka_local.KafkaLocalError, match="security_protocol"):
        kafka_local.broker_overrides(KafkaSettings(security_protocol="TLS"))
    with pytest.raises(kafka_local.KafkaLocalError, match="must be one of the users"):
        kafka_local.plain_sasl_broker_properties({"alice": "a"}, "broker")
    with pytest.raises(kafka_local.KafkaLocalError, match="quotes"):
        kafka_local.plain_sasl_broker_properties({"broker": 'x"y'}, "broker")
