"""The compose file and Kubernetes manifests cannot run here (no Docker); check them statically."""

from __future__ import annotations

from tokentrail import deploy_check


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
