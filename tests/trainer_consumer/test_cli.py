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
    (["--nproc", "0"], "--nproc must be at least 1"),
    (["--nproc", "2", "--max-restarts", "-1"], "--max-restarts must be >= 0"),
])
def test_bad_arguments_are_a_clear_cli_error(capsys, argv, message) -> None:
    assert main(["train", *argv]) == 2
    assert message in capsys.readouterr().err


def test_nproc_hands_the_parsed_options_to_torchrun(monkeypatch) -> None:
    import trainer_consumer.rank_launch as rank_launch

    launched = []
    monkeypatch.setattr(rank_launch, "launch_ranks", lambda options, nproc, max_restarts: launched.append(
        (options, nproc, max_restarts)) or 0)
    assert main(["train", "--nproc", "2", "--max-restarts", "3", "--batch-size", "12", "--until-idle",
                 "--layout", "packed", "--threads", "1"]) == 0
    [(options, nproc, max_restarts)] = launched
    assert (nproc, max_restarts) == (2, 3)
    assert options.batch_size == 12 and options.until_idle and options.torch_threads == 1
    assert options.learner is not None and options.learner.layout == "packed"
