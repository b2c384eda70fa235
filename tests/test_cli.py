"""The `rtrl` command: every subcommand is listed, and a bad config is a clear error, not a traceback."""

from __future__ import annotations

import subprocess
import sys

from lab.commands import COMMANDS as LAB_COMMANDS
from rl_core.cli import COMMANDS, commands, main


def test_help_lists_every_subcommand(capsys):
    try:
        main(["--help"])
    except SystemExit as e:
        assert e.code == 0
    out = capsys.readouterr().out
    for name in ("init", "config", "serve", "collect", "harvest", "rewards", "train", "eval", "register", "ab",
                 "promote", "rollback", "forget"):
        assert name in COMMANDS and name in out
    for name in ("simulate", "experiment", "cycle", "bench", "stack"):  # the lab's, through its entry point
        assert name in LAB_COMMANDS and name not in COMMANDS and name in commands() and name in out


def test_bad_config_names_field(tmp_path, monkeypatch):
    bad = tmp_path / "rtrl.toml"
    bad.write_text("[train]\nzero_stage = 9\n")
    env = {"RTRL_CONFIG": str(bad), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-m", "rl_core.cli", "config", "show"], capture_output=True, text=True, env=env)
    assert r.returncode == 2
    assert str(bad) in r.stderr and "[train] zero_stage" in r.stderr and "Traceback" not in r.stderr


def test_no_command_is_an_error(capsys):
    assert main([]) == 2
