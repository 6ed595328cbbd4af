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


def test_the_instance_id_setting_names_each_worker_by_its_host(monkeypatch) -> None:
    import socket

    from tokentrail.commands.process import instance_id
    from tokentrail.settings import Settings

    monkeypatch.setenv("TOKENTRAIL_PROCESSORS__INSTANCE_ID", "{hostname}")
    settings = Settings()
    assert instance_id(None, settings) == socket.gethostname()  # as the compose file and StatefulSet set it
    assert instance_id("worker-7", settings) == "worker-7"  # the flag wins
    monkeypatch.delenv("TOKENTRAIL_PROCESSORS__INSTANCE_ID")
    assert instance_id(None, Settings()) is None  # default: dynamic membership
