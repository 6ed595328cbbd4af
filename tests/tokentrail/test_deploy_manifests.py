"""The compose file and Kubernetes manifests cannot run here (no Docker); check them statically."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tokentrail.commands import deploy_check


def test_deploy_manifests_are_consistent_with_the_code() -> None:
    assert deploy_check.check() == []


def test_the_check_catches_a_wrong_subcommand_and_setting(tmp_path, monkeypatch) -> None:
    bad = tmp_path / "docker-compose.yaml"
    bad.write_text(
        "services:\n"
        "  x:\n"
        "    image: tokentrail:latest\n"
        "    command: [tokentrail, no-such-command]\n"
        "    environment: {TOKENTRAIL_KAFKA__NO_SUCH_FIELD: '1'}\n"
    )
    monkeypatch.setattr(deploy_check, "COMPOSE", bad)
    monkeypatch.setattr(deploy_check, "K8S_DIR", tmp_path)
    problems = deploy_check.check()
    assert any("no-such-command" in p for p in problems)
    assert any("NO_SUCH_FIELD" in p for p in problems)


def test_the_instance_id_setting_names_each_worker_by_its_host(monkeypatch) -> None:
    import socket

    from tokentrail.runtime.process import instance_id
    from tokentrail.settings import Settings

    monkeypatch.setenv("TOKENTRAIL_PROCESSORS__INSTANCE_ID", "{hostname}")
    settings = Settings()
    assert instance_id(None, settings) == socket.gethostname()  # as the compose file and StatefulSet set it
    assert instance_id("worker-7", settings) == "worker-7"  # the flag wins
    monkeypatch.delenv("TOKENTRAIL_PROCESSORS__INSTANCE_ID")
    assert instance_id(None, Settings()) is None  # default: dynamic membership


# ------------------------------------------------------------------ security of the deploy files (issue 17)

ADMIN_VAR = "TOKENTRAIL_GATEWAY__ADMIN_KEY"
CH_PASSWORD_VAR = "TOKENTRAIL_CLICKHOUSE__PASSWORD"


def _compose() -> dict[str, Any]:
    return yaml.safe_load(deploy_check.COMPOSE.read_text())


def _k8s() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((deploy_check.K8S_DIR / "tokentrail.yaml").read_text()) if d]


def _command_of(service: dict[str, Any]) -> list[str]:
    command = service.get("command") or []
    return command if isinstance(command, list) else []


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])


def test_compose_does_not_publish_kafka_or_clickhouse() -> None:
    services = _compose()["services"]
    stores = {n: s for n, s in services.items() if "kafka" in s.get("image", "") or "clickhouse" in s.get("image", "")}
    images = [s["image"] for s in stores.values()]
    assert any("kafka" in i for i in images) and any("clickhouse" in i for i in images)
    for name, service in stores.items():
        assert not service.get("ports"), f"{name} is published on the host"


def test_compose_gives_credentials_from_env_files_only() -> None:
    services = _compose()["services"]
    gateway = next(s for s in services.values() if _command_of(s)[:2] == ["tokentrail", "gateway"])
    assert ADMIN_VAR not in (gateway.get("environment") or {}) and gateway.get("env_file")
    for service in services.values():
        for var, value in (service.get("environment") or {}).items():
            assert not ("PASSWORD" in var or var.endswith("_KEY")) or not value, var


def test_compose_runs_a_replicated_kafka() -> None:
    compose = _compose()
    brokers = [s for s in compose["services"].values() if "apache/kafka" in s.get("image", "")]
    assert len(brokers) >= 3
    for broker in brokers:
        assert int(broker["environment"]["KAFKA_DEFAULT_REPLICATION_FACTOR"]) == 3
        assert int(broker["environment"]["KAFKA_MIN_INSYNC_REPLICAS"]) == 2
    assert compose["x-tokentrail"]["environment"]["TOKENTRAIL_KAFKA__MIN_INSYNC_REPLICAS"] == "2"


def test_kubernetes_services_stay_inside_the_cluster_and_keys_come_from_secrets() -> None:
    docs = _k8s()
    for doc in docs:
        if doc["kind"] == "Service":
            assert doc["spec"].get("type", "ClusterIP") == "ClusterIP", doc["metadata"]["name"]
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    assert config["TOKENTRAIL_KAFKA__MIN_INSYNC_REPLICAS"] == "2"
    assert not any("PASSWORD" in k or k.endswith("_KEY") for k in config)
    by_command = {c["command"][1]: c for d in docs for c in _containers(d)}
    refs = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef") for e in by_command["gateway"].get("env", [])}
    assert refs.get(ADMIN_VAR) and refs[ADMIN_VAR].get("optional") is not True
    sink_refs = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef") for e in by_command["sink"].get("env", [])}
    assert sink_refs.get(CH_PASSWORD_VAR)


@pytest.fixture
def manifests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., list[str]]:
    """``manifests(compose=fn, k8s=fn)``: the check's problems with the real files changed by ``fn`` (a copy
    in tmp_path; ``fn`` edits the parsed compose dict, or the list of Kubernetes documents, in place)."""
    compose_dir, k8s_dir = tmp_path / "compose", tmp_path / "k8s"
    shutil.copytree(deploy_check.COMPOSE.parent, compose_dir)
    shutil.copytree(deploy_check.K8S_DIR, k8s_dir)

    def run(compose: Callable[[dict[str, Any]], Any] | None = None,
            k8s: Callable[[list[dict[str, Any]]], Any] | None = None) -> list[str]:
        doc = _compose()
        if compose:
            compose(doc)
        (compose_dir / deploy_check.COMPOSE.name).write_text(yaml.safe_dump(doc, sort_keys=False))
        docs = _k8s()
        if k8s:
            k8s(docs)
        (k8s_dir / "tokentrail.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
        monkeypatch.setattr(deploy_check, "COMPOSE", compose_dir / deploy_check.COMPOSE.name)
        monkeypatch.setattr(deploy_check, "K8S_DIR", k8s_dir)
        return deploy_check.check()

    return run


def _service(doc: dict[str, Any], image_part: str) -> dict[str, Any]:
    return next(s for s in doc["services"].values() if image_part in s.get("image", ""))


def _gateway(doc: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in doc["services"].values() if _command_of(s)[:2] == ["tokentrail", "gateway"])


def _k8s_container(docs: list[dict[str, Any]], command: str) -> dict[str, Any]:
    return next(c for d in docs for c in _containers(d) if c["command"][1] == command)


def _add_env(service: dict[str, Any], name: str, value: str) -> None:
    service["environment"] = {**(service.get("environment") or {}), name: value}


COMPOSE_BREAKS: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    "kafka published": (lambda d: _service(d, "apache/kafka").update(ports=["9092:9092"]), "publishes"),
    "clickhouse published": (lambda d: _service(d, "clickhouse").update(ports=["8123:8123"]), "publishes"),
    "admin key inline": (lambda d: _add_env(_gateway(d), ADMIN_VAR, "k"), ADMIN_VAR),
    "no admin key": (lambda d: _gateway(d).pop("env_file"), ADMIN_VAR),
    "clickhouse password inline": (lambda d: _add_env(_service(d, "clickhouse"), "CLICKHOUSE_PASSWORD", "pw"),
                                   "CLICKHOUSE_PASSWORD"),
    "clickhouse server without password": (lambda d: _service(d, "clickhouse").pop("env_file"), "CLICKHOUSE_PASSWORD"),
    "sink without password": (lambda d: d["services"]["sink"].pop("env_file"), CH_PASSWORD_VAR),
    "kafka credentials inline": (lambda d: _add_env(d["services"]["sink"], "TOKENTRAIL_KAFKA__EXTRA_CLIENT_CONFIG",
                                                    '{"sasl.username": "u", "sasl.password": "p"}'), "sasl.password"),
    "password in a DSN": (lambda d: _add_env(d["services"]["sink"], "TOKENTRAIL_CLICKHOUSE__DSN",
                                             "http://u:pw@clickhouse:8123"), "DSN"),
    "min isr 1": (lambda d: _add_env(d["services"]["sink"], "TOKENTRAIL_KAFKA__MIN_INSYNC_REPLICAS", "1"),
                  "MIN_INSYNC_REPLICAS"),
    "replication 1": (lambda d: _service(d, "apache/kafka")["environment"].update(KAFKA_DEFAULT_REPLICATION_FACTOR="1"),
                      "REPLICATION_FACTOR"),
    "one broker": (lambda d: [d["services"].pop(n) for n in [n for n, s in d["services"].items()
                                                              if "apache/kafka" in s.get("image", "")][1:]],
                   "broker"),
}


@pytest.mark.parametrize("case", list(COMPOSE_BREAKS))
def test_the_check_catches_an_insecure_compose_file(manifests, case: str) -> None:
    assert manifests() == []  # the real files, copied: clean
    change, needle = COMPOSE_BREAKS[case]
    problems = manifests(compose=change)
    assert any(needle in p for p in problems), problems


def _set_service_type(docs: list[dict[str, Any]], kind: str) -> None:
    next(d for d in docs if d["kind"] == "Service")["spec"]["type"] = kind


def _gateway_env(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return _k8s_container(docs, "gateway")["env"]


K8S_BREAKS: dict[str, tuple[Callable[[list[dict[str, Any]]], Any], str]] = {
    "node port": (lambda d: _set_service_type(d, "NodePort"), "NodePort"),
    "load balancer": (lambda d: _set_service_type(d, "LoadBalancer"), "LoadBalancer"),
    "host port": (lambda d: _k8s_container(d, "sink").update(ports=[{"containerPort": 1, "hostPort": 1}]), "hostPort"),
    "admin key literal": (lambda d: [e.update(value="k") or e.pop("valueFrom") for e in _gateway_env(d)
                                     if e["name"] == ADMIN_VAR], ADMIN_VAR),
    "no admin key": (lambda d: _k8s_container(d, "gateway").update(
        env=[e for e in _gateway_env(d) if e["name"] != ADMIN_VAR]), ADMIN_VAR),
    "optional admin key": (lambda d: [e["valueFrom"]["secretKeyRef"].update(optional=True) for e in _gateway_env(d)
                                      if e["name"] == ADMIN_VAR], "optional"),
    "unknown secret key": (lambda d: [e["valueFrom"]["secretKeyRef"].update(key="nope") for e in _gateway_env(d)
                                      if e["name"] == ADMIN_VAR], "nope"),
    "password in the config map": (lambda d: next(x for x in d if x["kind"] == "ConfigMap")["data"].update(
        {CH_PASSWORD_VAR: "pw"}), CH_PASSWORD_VAR),
    "sink without password": (lambda d: _k8s_container(d, "sink").update(
        env=[e for e in _k8s_container(d, "sink").get("env", []) if e["name"] != CH_PASSWORD_VAR]), CH_PASSWORD_VAR),
    "kafka credentials not from a secret": (lambda d: _k8s_container(d, "process").update(
        env=[e for e in _k8s_container(d, "process").get("env", [])
             if e["name"] != "TOKENTRAIL_KAFKA__EXTRA_CLIENT_CONFIG"]), "EXTRA_CLIENT_CONFIG"),
    "min isr 1": (lambda d: next(x for x in d if x["kind"] == "ConfigMap")["data"].update(
        TOKENTRAIL_KAFKA__MIN_INSYNC_REPLICAS="1"), "MIN_INSYNC_REPLICAS"),
}


@pytest.mark.parametrize("case", list(K8S_BREAKS))
def test_the_check_catches_insecure_kubernetes_manifests(manifests, case: str) -> None:
    change, needle = K8S_BREAKS[case]
    problems = manifests(k8s=change)
    assert any(needle in p for p in problems), problems


# ------------------------------------------------------------------ the release guard (issue 22)


def test_the_release_controller_runs_once_and_the_gateway_and_trainer_follow_its_decisions() -> None:
    """One controller (it must not run twice), its command a real one, and the two followers switched on."""
    from tokentrail.cli import build_parser

    services = _compose()["services"]
    controllers = [s for s in services.values() if _command_of(s)[:3] == ["tokentrail", "release", "control"]]
    assert len(controllers) == 1 and controllers[0].get("deploy", {}).get("replicas") == 1
    assert _compose()["x-tokentrail"]["environment"]["TOKENTRAIL_GATEWAY__FOLLOW_RELEASES"] == "true"
    trainer = next(s for s in services.values() if _command_of(s)[:2] == ["tokentrail", "train"])
    assert "--follow-releases" in _command_of(trainer)

    docs = _k8s()
    deployments = [d for d in docs if any(c["command"][1:3] == ["release", "control"] for c in _containers(d))]
    assert len(deployments) == 1 and deployments[0]["kind"] == "Deployment"
    assert deployments[0]["spec"]["replicas"] == 1 and deployments[0]["spec"]["strategy"]["type"] == "Recreate"
    assert next(d for d in docs if d["kind"] == "ConfigMap")["data"]["TOKENTRAIL_GATEWAY__FOLLOW_RELEASES"] == "true"
    by_command = {c["command"][1]: c for d in docs for c in _containers(d)}
    assert "--follow-releases" in by_command["train"]["command"]
    for command in (controllers[0]["command"], _containers(deployments[0])[0]["command"]):
        args = build_parser().parse_args(command[1:])  # the CLI accepts it as written
        assert args.progress_every == 60
