"""Shared fixtures: every test runs on the tiny profile with its own RTRL_HOME (lake, MLflow, models).

The tiny model is built once per session and copied into each test's home; Airflow gets a session
AIRFLOW_HOME set before anything imports airflow (Airflow reads it at import time).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_SESSION_TMP = Path(tempfile.mkdtemp(prefix="rtrl-tests-"))

os.environ["RTRL_PROFILE"] = "tiny"
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RTRL_CACHE", str(Path.home() / ".cache" / "rtrl"))
os.environ["AIRFLOW_HOME"] = str(_SESSION_TMP / "airflow")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "dags")
os.environ["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(REPO / "plugins")
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "True"
os.environ["GIT_PYTHON_REFRESH"] = "quiet"
os.environ["MLFLOW_ENABLE_ASYNC_LOGGING"] = "false"
for _k in [k for k in os.environ if k.startswith("RTRL_") and "__" in k]:
    del os.environ[_k]  # a developer's overrides must not leak into tests


@pytest.fixture(scope="session")
def mlflow_db_template() -> Path:
    """An empty, fully migrated MLflow SQLite DB: migrating costs ~20 s, copying it ~nothing."""
    from rl_core.config import load_config
    from rl_core.registry import store

    home = _SESSION_TMP / "mlflow-template"
    home.mkdir(exist_ok=True)
    cfg = load_config(REPO / "rtrl.toml", environ={"RTRL_PROFILE": "tiny", "RTRL_HOME": str(home)})
    store.client(cfg).search_registered_models()  # runs the migrations
    return home / "mlflow.db"


@pytest.fixture
def rtrl_home(tmp_path, monkeypatch, mlflow_db_template) -> Path:
    """A fresh RTRL_HOME for this test (with an empty, migrated MLflow DB in it)."""
    home = tmp_path / "var"
    home.mkdir()
    shutil.copy(mlflow_db_template, home / "mlflow.db")
    monkeypatch.setenv("RTRL_HOME", str(home))
    monkeypatch.setenv("RTRL_CONFIG", str(REPO / "rtrl.toml"))
    return home


@pytest.fixture
def own_processes(rtrl_home):
    """A function listing the live processes (zombies excluded) whose environment carries this test's
    RTRL_HOME: what a command started, however deep, and whichever session it put them in."""
    mark = f"RTRL_HOME={rtrl_home}".encode()

    def live() -> list[int]:
        pids = []
        for d in Path("/proc").iterdir():
            try:
                if d.name.isdigit() and int(d.name) != os.getpid() and mark in (d / "environ").read_bytes().split(b"\0") \
                        and "\nState:\tZ" not in (d / "status").read_text():
                    pids.append(int(d.name))
            except OSError:
                pass
        return pids

    return live


@pytest.fixture
def cfg(rtrl_home):
    """The effective tiny-profile config rooted at this test's RTRL_HOME."""
    from rl_core.config import load_config

    return load_config()


@pytest.fixture(scope="session")
def tiny_checkpoint() -> Path:
    """The tiny random-init checkpoint (built once per session; treat as read-only)."""
    from rl_core.config import load_config
    from rl_core.models import build_tiny

    mc = load_config(REPO / "rtrl.toml", environ={"RTRL_PROFILE": "tiny"}).model
    return build_tiny(_SESSION_TMP / "models" / "tiny", mc)


@pytest.fixture
def registered(cfg, tiny_checkpoint):
    """cfg whose MLflow registry holds the tiny model as version 1, alias champion (as after `rtrl init`)."""
    from rl_core.init import init

    target = cfg.models_dir / "tiny"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(tiny_checkpoint, target)
    init(cfg, check_generation=False)
    return cfg


@contextmanager
def served_gateway(tmp_path_factory, tiny_checkpoint: Path, name: str, **env: str):
    """A gateway on a free port for a test module: the tiny model registered as v1 champion in a fresh
    RTRL_HOME (env: more RTRL_* settings). Yields (cfg, base_url, gateway)."""
    from rl_core.config import load_config
    from rl_core.init import init
    from rl_core.serving.server import build_gateway, serve_in_thread

    mp = pytest.MonkeyPatch()
    mp.setenv("RTRL_HOME", str(tmp_path_factory.mktemp(name) / "var"))
    mp.setenv("RTRL_CONFIG", str(REPO / "rtrl.toml"))
    for key, value in env.items():
        mp.setenv(key, value)
    try:
        cfg = load_config()
        shutil.copytree(tiny_checkpoint, cfg.models_dir / "tiny")
        init(cfg, check_generation=False)
        gateway = build_gateway(cfg)
        with serve_in_thread(cfg, gateway=gateway) as base:
            yield cfg, base, gateway
    finally:
        mp.undo()


def http_interaction(**over) -> dict:
    """A valid `POST /v1/interactions` body (an interaction logged by another serving stack), fields overridden."""
    now = datetime(2026, 12, 2, 9, 0, tzinfo=timezone.utc)
    row = {"event_id": str(uuid.uuid4()), "user_id": "bob", "session_id": "s9", "turn_index": 0,
           "ts_request": now.isoformat(), "ts_response": (now + timedelta(seconds=2)).isoformat(),
           "requested_model": "auto", "model_version": 1, "arm": "champion",
           "messages": [{"role": "user", "content": "x"}], "prompt_token_ids": [1, 2],
           "completion_token_ids": [3, 4], "completion_logprobs": [-0.2, -0.3], "completion_text": "ok"}
    return row | over
