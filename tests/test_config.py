"""Config: defaults, file, profile, env overrides, and errors that name the file and the field."""

from __future__ import annotations

import pytest

from rl_core.cli import to_toml
from rl_core.config import REPO_ROOT, ConfigError, load_config


def write(tmp_path, text: str):
    p = tmp_path / "rtrl.toml"
    p.write_text(text)
    return p


def test_repo_file_loads_with_both_profiles():
    d = load_config(REPO_ROOT / "rtrl.toml", environ={})
    t = load_config(REPO_ROOT / "rtrl.toml", environ={"RTRL_PROFILE": "tiny"})
    assert d.profile == "default" and d.model.base == "smollm2-135m"
    assert t.profile == "tiny" and t.model.base == "tiny" and t.serving.backend == "transformers"
    assert t.gates.min_episodes < d.gates.min_episodes


def test_file_values_and_paths_resolve_under_home(tmp_path):
    cfg = load_config(write(tmp_path, 'home = "state"\n[lake]\nroot = "lk"\n[serving]\nport = 9001\n'), environ={})
    assert cfg.serving.port == 9001
    assert cfg.lake_root == str(tmp_path / "state" / "lk")
    assert cfg.tracking_uri == f"sqlite:///{tmp_path / 'state'}/mlflow.db"
    assert cfg.path("s3://b/x") == "s3://b/x"


def test_env_overrides_win_and_parse_json(tmp_path):
    env = {
        "RTRL_SERVING__PORT": "9100",
        "RTRL_SERVING__TOKENS": '{"t1": "org-a"}',
        "RTRL_TRAIN__LORA": "true",
        "RTRL_SERVING__HOST": "127.0.0.1",
        "RTRL_HOME": str(tmp_path / "h"),
    }
    cfg = load_config(write(tmp_path, "[serving]\nport = 9001\n"), environ=env)
    assert cfg.serving.port == 9100
    assert cfg.serving.tokens == {"t1": "org-a"}
    assert cfg.train.lora is True
    assert cfg.home == str(tmp_path / "h")


def test_error_names_file_section_and_key(tmp_path):
    p = write(tmp_path, "[serving]\nport = 70000\n")
    with pytest.raises(ConfigError) as e:
        load_config(p, environ={})
    msg = str(e.value)
    assert str(p) in msg and "[serving] port" in msg


def test_error_names_env_variable(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, ""), environ={"RTRL_TRAIN__ZERO_STAGE": "7"})
    assert "env RTRL_TRAIN__ZERO_STAGE" in str(e.value) and "zero_stage" in str(e.value)


def test_unknown_key_and_bad_toml_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"\[serving\] prot"):
        load_config(write(tmp_path, "[serving]\nprot = 1\n"), environ={})
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[serving\n"), environ={})
    with pytest.raises(ConfigError, match="unknown profile"):
        load_config(write(tmp_path, ""), environ={"RTRL_PROFILE": "huge"})


def test_toml_round_trip(tmp_path):
    cfg = load_config(REPO_ROOT / "rtrl.toml", environ={"RTRL_PROFILE": "tiny"})
    text = to_toml(cfg).replace('profile = "tiny"', "")
    again = load_config(write(tmp_path, text), environ={"RTRL_PROFILE": "tiny"})
    assert again.model_dump(exclude={"source"}) == cfg.model_dump(exclude={"source"})


def test_reward_config_hash_changes_with_weights(tmp_path):
    a = load_config(write(tmp_path, ""), environ={}).rewards.config_hash()
    b = load_config(write(tmp_path, "[rewards]\nreward_clip = 3.0\n"), environ={}).rewards.config_hash()
    assert a != b and len(a) == 16
