"""``tokentrail gateway`` refuses to listen beyond loopback without an admin key (issue 17)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tokentrail.settings import REPO_ROOT

ADMIN_VAR = "TOKENTRAIL_GATEWAY__ADMIN_KEY"


def _gateway(*args: str, env: dict[str, str] | None = None, timeout_s: float = 120) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in (ADMIN_VAR, "TOKENTRAIL_GATEWAY__REQUIRE_AUTH")}
    return subprocess.run([sys.executable, "-m", "tokentrail.cli", "gateway", *args], cwd=REPO_ROOT,
                          env={**clean, **(env or {})}, capture_output=True, text=True, timeout=timeout_s)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "gateway.example.com"])
def test_a_non_loopback_address_without_an_admin_key_is_refused(host: str) -> None:
    done = _gateway("--host", host, "--port", "1")
    assert done.returncode == 2, done.stderr
    assert ADMIN_VAR in done.stderr and "--insecure-listen" in done.stderr and host in done.stderr
    assert "Traceback" not in done.stderr
    assert "tokentrail gateway on" not in done.stdout  # it never got as far as serving


def test_the_host_setting_is_checked_too() -> None:
    done = _gateway("--port", "1", env={"TOKENTRAIL_GATEWAY__HOST": "0.0.0.0"})
    assert done.returncode == 2 and ADMIN_VAR in done.stderr


def test_an_admin_key_or_the_override_passes_the_check(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """With the key (or --insecure-listen, which warns) the command goes on to build the app (stopped there)."""
    import producers.gateway.wiring
    from tokentrail import cli
    from tokentrail.settings import get_settings

    def stop(*_: object, **__: object) -> None:
        raise ValueError("build_app reached")

    monkeypatch.setattr(producers.gateway.wiring, "build_app", stop)
    for env, flags in (({ADMIN_VAR: "k" * 32}, []), ({}, ["--insecure-listen"]),
                       ({"TOKENTRAIL_GATEWAY__REQUIRE_AUTH": "true"}, ["--host", "127.0.0.1"])):
        monkeypatch.delenv(ADMIN_VAR, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        get_settings.cache_clear()
        try:
            assert cli.main(["gateway", "--host", "0.0.0.0", "--port", "1", *flags]) == 2
        finally:
            get_settings.cache_clear()
            for name in env:
                monkeypatch.delenv(name)
        err = capsys.readouterr().err
        assert "build_app reached" in err and "refuses to listen" not in err, err
        if "--insecure-listen" in flags:
            assert "WARNING" in err and "without authentication" in err
        if "TOKENTRAIL_GATEWAY__REQUIRE_AUTH" in env:
            assert "require_auth is deprecated" in err and ADMIN_VAR in err


def test_loopback_addresses() -> None:
    from tokentrail.commands.gateway import is_loopback

    for host in ("127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost", "LOCALHOST", "localhost."):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "", "10.0.0.1", "192.168.1.1", "::ffff:10.0.0.1", "gateway.example.com",
                 "localhost.example.com", "[::]"):
        assert not is_loopback(host), host
