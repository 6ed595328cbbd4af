"""Static checks of the deploy manifests (no Docker or Kubernetes here): they parse, every service
runs a real ``tokentrail`` subcommand, and every TOKENTRAIL_* variable names a real setting.

Run: ``python -m tokentrail.deploy_check``; exit code 1 with the problems listed.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml

from tokentrail.cli import build_parser
from tokentrail.settings import REPO_ROOT, Settings

COMPOSE = REPO_ROOT / "deploy" / "compose" / "docker-compose.yaml"
K8S_DIR = REPO_ROOT / "deploy" / "k8s"


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


def check() -> list[str]:
    problems: list[str] = []
    known = _subcommands()
    compose = yaml.safe_load(COMPOSE.read_text())
    for name, service in compose.get("services", {}).items():
        where = f"compose service {name}"
        if "image" not in service:
            problems.append(f"{where}: no image")
        _check_command(service.get("command"), where, known, problems)
        for var in (service.get("environment") or {}):
            _check_env(var, where, problems)
    for path in sorted(K8S_DIR.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            where = f"{path.name} {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
            for key in ("apiVersion", "kind", "metadata"):
                if key not in doc:
                    problems.append(f"{where}: missing {key}")
            if doc.get("kind") == "ConfigMap":
                for var in doc.get("data", {}):
                    _check_env(var, where, problems)
            spec = doc.get("spec", {}).get("template", {}).get("spec", {})
            for container in spec.get("containers", []):
                _check_command(container.get("command"), where, known, problems)
                for var in container.get("env", []):
                    _check_env(var.get("name", ""), where, problems)
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
