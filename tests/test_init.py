"""`rtrl init` on the tiny profile: a real checkpoint, registered in MLflow (SQLite) as version 1 champion."""

from __future__ import annotations

import subprocess
import sys

from rl_core.models import is_complete, load_model
from rl_core.registry import store


def test_init_registers_version_1_as_champion_and_is_idempotent(registered):
    cfg = registered
    assert store.version_for_alias(cfg, "champion") == 1
    mv = store.get_version(cfg, 1)
    assert mv.tags["base"] == "tiny" and mv.tags["kind"] == "base"
    folder = store.checkpoint_path(cfg, 1)
    assert (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))
    model, tok = load_model(folder)
    assert model.config.vocab_size == len(tok)

    from rl_core.init import init

    again = init(cfg, check_generation=False)
    assert again.version == 1 and not again.created
    assert store.aliases(cfg) == {"champion": 1}


def test_alias_moves_are_recorded(registered):
    cfg = registered
    v2 = store.register_checkpoint(cfg, store.checkpoint_path(cfg, 1), run_name="copy", tags={"parent_version": 1})
    store.set_alias(cfg, "champion", v2, "test move")
    assert store.version_for_alias(cfg, "champion") == v2
    tags = store.get_version(cfg, v2).tags
    assert tags["alias.champion.previous"] == "1"
    assert tags["alias.champion.set_reason"] == "test move" and "alias.champion.set_at" in tags
    assert "moved to version" in store.get_version(cfg, 1).description  # the old holder's history says where it went
    assert store.delete_alias(cfg, "champion", "gone") == v2
    assert store.version_for_alias(cfg, "champion") is None


def test_tiny_checkpoint_generates(tiny_checkpoint):
    from rl_core.models import smoke_generate

    assert is_complete(tiny_checkpoint)
    assert isinstance(smoke_generate(tiny_checkpoint), str)


def test_cli_init_and_config_show(rtrl_home, tiny_checkpoint):
    import shutil

    shutil.copytree(tiny_checkpoint, rtrl_home / "models" / "tiny")
    out = subprocess.run([sys.executable, "-m", "rl_core.cli", "init", "--no-check"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "version 1" in out.stdout and "champion" in out.stdout
    show = subprocess.run([sys.executable, "-m", "rl_core.cli", "config", "show"], capture_output=True, text=True)
    assert show.returncode == 0 and 'base = "tiny"' in show.stdout and str(rtrl_home) in show.stdout
