"""Static checks of the deploy manifests (no Docker or Kubernetes here): they parse, every service
runs a real ``tokentrail`` subcommand, every TOKENTRAIL_* variable names a real setting, and they are
secure (docs/operations.md, "Security"):

- credentials come from secrets, never from the manifests: compose ``env_file``s (each with a
  ``.example`` beside it naming its variables, kept out of the image), Kubernetes ``secretKeyRef``s (each
  naming a key of ``secrets.yaml.example``, none optional); no credential-named variable has a value in a
  manifest or a ConfigMap, no DSN carries a password, no inline Kafka client config a credential;
- the gateway gets ``TOKENTRAIL_GATEWAY__ADMIN_KEY`` that way, and every ClickHouse client and server its
  password; Kafka clients using SASL their client config;
- Kafka and ClickHouse are not published (no compose ``ports:``); Kubernetes Services are ClusterIP,
  with no host ports or host network;
- Kafka is replicated: compose runs at least ``default.replication.factor`` (>= 3) brokers, and
  ``TOKENTRAIL_KAFKA__MIN_INSYNC_REPLICAS`` is at least 2 and below the replication factor.

Run: ``python -m tokentrail.deploy_check``; exit code 1 with the problems listed.
"""

from __future__ import annotations

import fnmatch
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import yaml

from producers.gateway.records import is_secret_field
from tokentrail.cli import build_parser
from tokentrail.settings import REPO_ROOT, Settings

COMPOSE = REPO_ROOT / "deploy" / "compose" / "docker-compose.yaml"
K8S_DIR = REPO_ROOT / "deploy" / "k8s"
K8S_SECRET_EXAMPLE = "secrets.yaml.example"
DOCKERIGNORE = "Dockerfile.dockerignore"

ADMIN_KEY = "TOKENTRAIL_GATEWAY__ADMIN_KEY"
CLICKHOUSE_PASSWORD = "TOKENTRAIL_CLICKHOUSE__PASSWORD"
CLICKHOUSE_SERVER_PASSWORD = "CLICKHOUSE_PASSWORD"
KAFKA_CLIENT_CONFIG = "TOKENTRAIL_KAFKA__EXTRA_CLIENT_CONFIG"
KAFKA_PROTOCOL = "TOKENTRAIL_KAFKA__SECURITY_PROTOCOL"
MIN_ISR = "TOKENTRAIL_KAFKA__MIN_INSYNC_REPLICAS"
MIN_REPLICATION = 3
# Subcommands that open ClickHouse (and so need its password).
CLICKHOUSE_COMMANDS = {"sink", "clickhouse", "audit", "trace", "replay", "report"}
# Variables that carry a URL, which must not carry a password.
URL_VARS = ("DSN", "URL")


def _subcommands() -> set[str]:
    parser = build_parser()
    actions = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    return set(actions[0].choices) if actions else set()


def _check_env(name: str, where: str, problems: list[str]) -> None:
    if not name.startswith("TOKENTRAIL_"):
        return
    section, _, field = name.removeprefix("TOKENTRAIL_").lower().partition("__")
    fields = Settings.model_fields
    if section not in fields:
        problems.append(f"{where}: {name} names no settings section {section!r}")
        return
    model = fields[section].default_factory() if fields[section].default_factory else None  # type: ignore[misc]
    if field and model is not None and field not in type(model).model_fields:
        problems.append(f"{where}: {name} names no field {field!r} in section {section!r}")


def _check_command(command: Any, where: str, known: set[str], problems: list[str]) -> None:
    is_ours = isinstance(command, list) and bool(command) and command[0] == "tokentrail"
    if is_ours and (len(command) < 2 or command[1] not in known):
        problems.append(f"{where}: `{' '.join(command)}` is not a tokentrail subcommand")


def _subcommand(command: Any) -> str | None:
    ours = isinstance(command, list) and len(command) > 1 and command[0] == "tokentrail"
    return str(command[1]) if ours else None


# ---------------------------------------------------------------- credentials


def _is_credential(name: str) -> bool:
    """A variable whose value is a credential (by the gateway's redaction rule: *_PASSWORD, *_KEY of a
    secret kind, *_TOKEN, *SECRET*, ...)."""
    return is_secret_field(name)


def _check_value(name: str, value: Any, where: str, problems: list[str]) -> None:
    """A variable given its value in a manifest (not from a secret)."""
    text = "" if value is None else str(value)
    if not text:
        return
    if _is_credential(name):
        problems.append(f"{where}: {name} has its value in the manifest; credentials must come from a secret")
    if name == KAFKA_CLIENT_CONFIG:
        try:
            config = orjson.loads(text)
        except orjson.JSONDecodeError:
            config = {}
        secret = [k for k in config if is_secret_field(str(k))] if isinstance(config, dict) else []
        if secret:
            problems.append(f"{where}: {name} carries {', '.join(secret)} in the manifest; put the Kafka client "
                            "config in a secret")
    if name.endswith(URL_VARS) and "://" in text:
        try:
            password = urlsplit(text).password
        except ValueError:
            password = None
        if password:
            problems.append(f"{where}: {name} has a password in its URL; give it as a setting from a secret")


def _uses_sasl(protocol: Any) -> bool:
    return "SASL" in str(protocol or "").upper()


# ---------------------------------------------------------------- compose


def _env_dict(environment: Any) -> dict[str, Any]:
    if isinstance(environment, dict):
        return dict(environment)
    found: dict[str, Any] = {}
    for item in environment or []:
        name, _, value = str(item).partition("=")
        found[name] = value
    return found


def _env_files(service: dict[str, Any]) -> list[str]:
    raw = service.get("env_file") or []
    entries = [raw] if isinstance(raw, str | dict) else list(raw)
    return [str(e["path"] if isinstance(e, dict) else e) for e in entries]


def _example_names(path: Path) -> set[str]:
    names = set()
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            names.add(line.split("=", 1)[0].removeprefix("export ").strip())
    return names


def _dockerignore_patterns(base: Path) -> list[str]:
    path = base / DOCKERIGNORE
    if not path.exists():
        return []
    lines = [line.strip() for line in path.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith(("#", "!"))]


def _ignored(relative: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(relative, p) or fnmatch.fnmatch(relative, p.removeprefix("**/"))
               or fnmatch.fnmatch(Path(relative).name, p.removeprefix("**/")) for p in patterns)


def _compose_secrets(service: dict[str, Any], base: Path, where: str, problems: list[str]) -> set[str]:
    """The variables a service gets from its env files (as their .example files name them)."""
    names: set[str] = set()
    patterns = _dockerignore_patterns(base)
    for file in _env_files(service):
        example = base / f"{file}.example"
        if not example.exists():
            problems.append(f"{where}: env_file {file} has no {example.name} beside it naming its variables")
            continue
        names |= _example_names(example)
        relative = str((base / file).resolve().relative_to(REPO_ROOT.resolve())) \
            if (base / file).resolve().is_relative_to(REPO_ROOT.resolve()) else file
        if not _ignored(relative, patterns):
            problems.append(f"{where}: env_file {file} is not excluded from the image ({DOCKERIGNORE}); the "
                            "Dockerfile copies the repository")
    return names


def _check_compose(compose: dict[str, Any], base: Path, known: set[str], problems: list[str]) -> None:
    services = compose.get("services", {}) or {}
    brokers: list[tuple[str, dict[str, Any]]] = []
    min_isrs: list[tuple[str, int]] = []
    for name, service in services.items():
        where = f"compose service {name}"
        if "image" not in service:
            problems.append(f"{where}: no image")
        command = service.get("command")
        _check_command(command, where, known, problems)
        env = _env_dict(service.get("environment"))
        for var, value in env.items():
            _check_env(var, where, problems)
            _check_value(var, value, where, problems)
        secrets = _compose_secrets(service, base, where, problems)
        for var in secrets:
            _check_env(var, f"{where} ({', '.join(_env_files(service))})", problems)
        image = str(service.get("image", ""))
        is_kafka, is_clickhouse = "kafka" in image, "clickhouse" in image and "grafana" not in image
        if (is_kafka or is_clickhouse) and service.get("ports"):
            problems.append(f"{where}: publishes ports {service['ports']} on the host; keep "
                            f"{'Kafka' if is_kafka else 'ClickHouse'} on the compose network (expose:, not ports:)")
        if is_kafka:
            brokers.append((name, env))
        if is_clickhouse and CLICKHOUSE_SERVER_PASSWORD not in secrets:
            problems.append(f"{where}: the ClickHouse server needs {CLICKHOUSE_SERVER_PASSWORD} from an env_file")
        sub = _subcommand(command)
        if sub is None:
            continue
        if sub == "gateway" and ADMIN_KEY not in secrets:
            problems.append(f"{where}: the gateway needs {ADMIN_KEY} from an env_file (it refuses to listen "
                            "beyond loopback without it)")
        if sub in CLICKHOUSE_COMMANDS and CLICKHOUSE_PASSWORD not in secrets:
            problems.append(f"{where}: `tokentrail {sub}` needs {CLICKHOUSE_PASSWORD} from an env_file")
        if _uses_sasl(env.get(KAFKA_PROTOCOL)) and KAFKA_CLIENT_CONFIG not in secrets:
            problems.append(f"{where}: Kafka over SASL needs {KAFKA_CLIENT_CONFIG} from an env_file")
        min_isrs.append((where, _int(env.get(MIN_ISR), 1)))
    _check_compose_kafka(brokers, min_isrs, problems)


def _int(value: Any, default: int) -> int:
    try:
        return int(str(value)) if value not in (None, "") else default
    except ValueError:
        return default


def _check_compose_kafka(brokers: list[tuple[str, dict[str, Any]]], min_isrs: list[tuple[str, int]],
                         problems: list[str]) -> None:
    replication = min((_int(env.get("KAFKA_DEFAULT_REPLICATION_FACTOR"), 1) for _, env in brokers), default=0)
    for name, env in brokers:
        factor = _int(env.get("KAFKA_DEFAULT_REPLICATION_FACTOR"), 1)
        if factor < MIN_REPLICATION:
            problems.append(f"compose service {name}: KAFKA_DEFAULT_REPLICATION_FACTOR is {factor}, needs >= "
                            f"{MIN_REPLICATION}")
        if _int(env.get("KAFKA_MIN_INSYNC_REPLICAS"), 1) < 2:
            problems.append(f"compose service {name}: KAFKA_MIN_INSYNC_REPLICAS must be >= 2")
    if brokers and len(brokers) < max(replication, MIN_REPLICATION):
        problems.append(f"compose: {len(brokers)} Kafka broker(s), fewer than the replication factor "
                        f"{max(replication, MIN_REPLICATION)}")
    for where, isr in min_isrs:
        _check_min_isr(where, isr, replication or MIN_REPLICATION, problems)


def _check_min_isr(where: str, isr: int, replication: int, problems: list[str]) -> None:
    if isr < 2:
        problems.append(f"{where}: {MIN_ISR} is {isr}; a replicated cluster needs >= 2 (acks=all means one "
                        "replica otherwise)")
    elif isr >= replication:
        problems.append(f"{where}: {MIN_ISR} is {isr}, not below the replication factor {replication} (one "
                        "broker down would stop every write)")


# ---------------------------------------------------------------- Kubernetes


def _secret_keys(k8s_dir: Path, problems: list[str]) -> dict[str, set[str]]:
    path = k8s_dir / K8S_SECRET_EXAMPLE
    if not path.exists():
        problems.append(f"{k8s_dir.name}: no {K8S_SECRET_EXAMPLE} naming the Secrets' keys")
        return {}
    keys: dict[str, set[str]] = {}
    for doc in yaml.safe_load_all(path.read_text()):
        if doc and doc.get("kind") == "Secret":
            data = {**(doc.get("data") or {}), **(doc.get("stringData") or {})}
            keys[doc["metadata"]["name"]] = set(data)
    return keys


def _pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    spec = doc.get("spec", {}) or {}
    if doc.get("kind") == "CronJob":
        spec = spec.get("jobTemplate", {}).get("spec", {}) or {}
    return spec.get("template", {}).get("spec", {}) or {}


def _check_k8s(k8s_dir: Path, known: set[str], problems: list[str]) -> None:
    secret_keys = _secret_keys(k8s_dir, problems)
    docs: list[tuple[str, dict[str, Any]]] = []
    for path in sorted(k8s_dir.glob("*.yaml")):
        docs += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    config_maps = {doc.get("metadata", {}).get("name"): doc.get("data") or {}
                   for _, doc in docs if doc.get("kind") == "ConfigMap"}
    for file, doc in docs:
        where = f"{file} {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        for key in ("apiVersion", "kind", "metadata"):
            if key not in doc:
                problems.append(f"{where}: missing {key}")
        kind = doc.get("kind")
        if kind == "ConfigMap":
            for var, value in (doc.get("data") or {}).items():
                _check_env(var, where, problems)
                _check_value(var, value, where, problems)
        if kind == "Secret":
            problems.append(f"{where}: a Secret with its values in the repository; create it in the cluster "
                            f"(its keys belong in {K8S_SECRET_EXAMPLE})")
        if kind == "Service":
            service_type = (doc.get("spec") or {}).get("type", "ClusterIP")
            if service_type != "ClusterIP":
                problems.append(f"{where}: type {service_type} publishes it outside the cluster; use ClusterIP "
                                "(and an Ingress with TLS for the gateway)")
            if (doc.get("spec") or {}).get("externalIPs"):
                problems.append(f"{where}: externalIPs publish it outside the cluster")
        pod = _pod_spec(doc)
        if pod.get("hostNetwork"):
            problems.append(f"{where}: hostNetwork puts the pod on the node's network")
        for container in pod.get("containers", []):
            _check_container(container, where, config_maps, secret_keys, known, problems)


def _check_container(container: dict[str, Any], where: str, config_maps: dict[str, dict[str, Any]],
                     secret_keys: dict[str, set[str]], known: set[str], problems: list[str]) -> None:
    command = container.get("command")
    _check_command(command, where, known, problems)
    for port in container.get("ports", []) or []:
        if port.get("hostPort"):
            problems.append(f"{where}: hostPort {port['hostPort']} publishes the container on the node")
    settings: dict[str, Any] = {}
    for source in container.get("envFrom", []) or []:
        if "configMapRef" in source:
            settings.update(config_maps.get(source["configMapRef"].get("name"), {}))
        if "secretRef" in source:
            problems.append(f"{where}: envFrom secretRef; name each credential with a secretKeyRef instead")
    from_secrets: set[str] = set()
    for var in container.get("env", []) or []:
        name = var.get("name", "")
        _check_env(name, where, problems)
        if "value" in var:
            _check_value(name, var["value"], where, problems)
            settings[name] = var["value"]
        ref = (var.get("valueFrom") or {}).get("secretKeyRef")
        if ref is None:
            continue
        if ref.get("optional"):
            problems.append(f"{where}: {name} is optional; a missing Secret must stop the pod, not start it "
                            "without credentials")
        if ref.get("key") not in secret_keys.get(ref.get("name"), set()):
            problems.append(f"{where}: {name} reads key {ref.get('key')!r} of Secret {ref.get('name')!r}, "
                            f"which {K8S_SECRET_EXAMPLE} does not name")
        from_secrets.add(name)
    sub = _subcommand(command)
    if sub is None:
        return
    if sub == "gateway" and ADMIN_KEY not in from_secrets:
        problems.append(f"{where}: the gateway needs {ADMIN_KEY} from a secretKeyRef (it refuses to listen "
                        "beyond loopback without it)")
    if sub in CLICKHOUSE_COMMANDS and CLICKHOUSE_PASSWORD not in from_secrets:
        problems.append(f"{where}: `tokentrail {sub}` needs {CLICKHOUSE_PASSWORD} from a secretKeyRef")
    if _uses_sasl(settings.get(KAFKA_PROTOCOL)) and KAFKA_CLIENT_CONFIG not in from_secrets:
        problems.append(f"{where}: Kafka over SASL needs {KAFKA_CLIENT_CONFIG} from a secretKeyRef")
    # Kafka is external here: its brokers must replicate 3 times (see the manifest's header).
    _check_min_isr(where, _int(settings.get(MIN_ISR), 1), MIN_REPLICATION, problems)


# ---------------------------------------------------------------- entry points


def check() -> list[str]:
    problems: list[str] = []
    known = _subcommands()
    compose = yaml.safe_load(COMPOSE.read_text())
    _check_compose(compose, COMPOSE.parent, known, problems)
    _check_k8s(K8S_DIR, known, problems)
    return problems


def main() -> int:
    problems = check()
    for problem in problems:
        print(f"deploy check: {problem}")
    print(f"deploy check: {'FAILED' if problems else 'ok'} ({COMPOSE.relative_to(REPO_ROOT)}, "
          f"{len(list(K8S_DIR.glob('*.yaml')))} Kubernetes file(s))")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
