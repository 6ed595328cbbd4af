from __future__ import annotations

import pytest

from tokentrail.cli import main


def test_train_help_lists_the_run_controls(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--max-steps", "--until-idle", "--batch-size", "--max-staleness", "--layout", "--ratio-cap"):
        assert flag in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--batch-size", "0"], "--batch-size must be at least 1"),
    (["--max-staleness", "-1"], "--max-staleness must be >= 0"),
    (["--ratio-cap", "0"], "ratio_cap must be > 0"),
])
def test_bad_arguments_are_a_clear_cli_error(capsys, argv, message) -> None:
    assert main(["train", *argv]) == 2
    assert message in capsys.readouterr().err
