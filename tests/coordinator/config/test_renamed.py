"""A renamed setting given under its old name stops the start naming the new one, as a flag, an
environment variable and a config file key: never silently ignored, never a generic "unknown"."""

from __future__ import annotations

import argparse

import pytest

from snapcoord.coordinator.config import environment, file, options
from snapcoord.coordinator.config.options import OPTIONS, RENAMED


def test_every_rename_points_at_a_setting_that_exists_and_reuses_no_current_name() -> None:
    names = {opt.name for opt in OPTIONS}
    assert RENAMED, "no renames listed: drop this test with the mechanism"
    for old, r in RENAMED.items():
        assert r.new in names, r
        assert old not in names, r


def test_the_old_flag_is_refused_naming_the_new_one(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="snapcoord serve")
    options.add_arguments(parser)
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--snapshot-max-report-size", "5MiB"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--snapshot-max-report-size was renamed to --max-inline-payload" in err
    assert "--snapshot-max-report-size" not in parser.format_help()


def test_the_old_variable_is_refused_naming_the_new_one() -> None:
    message = environment.unknown_variable({"SNAPCOORD_SNAPSHOT_MAX_REPORT_SIZE": "5MiB"})
    assert message is not None
    assert "SNAPCOORD_SNAPSHOT_MAX_REPORT_SIZE was renamed to SNAPCOORD_MAX_INLINE_PAYLOAD" in message


def test_the_old_file_key_is_refused_naming_the_new_one() -> None:
    with pytest.raises(
        file.ConfigFileError,
        match="line 2: key 'snapshot-max-report-size' was renamed to 'max-inline-payload'",
    ):
        file.parse("port: 50051\nsnapshot-max-report-size: 5MiB\n", source="f.yml")
