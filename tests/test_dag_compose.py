"""docker-compose.yaml describes the production stack: it validates, and every long-running service has
a health check; the gateway reserves a GPU; Airflow and MLflow share one PostgreSQL."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

COMPOSE = Path(__file__).resolve().parent.parent / "docker-compose.yaml"
LONG_RUNNING = {"postgres", "mlflow", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor",
                "airflow-triggerer", "gateway"}


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_services_health_checks_and_volumes():
    doc = _compose()
    services = doc["services"]
    assert LONG_RUNNING <= set(services)
    for name in LONG_RUNNING:
        assert "healthcheck" in services[name], f"{name} has no health check"
    gpu = services["gateway"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["capabilities"] == ["gpu"] and "--backend" in services["gateway"]["command"]
    assert "postgresql" in " ".join(services["mlflow"]["command"])
    env = services["airflow-scheduler"]["environment"]
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql")
    assert env["RTRL_MLFLOW__TRACKING_URI"] == "http://mlflow:5000"
    assert {"pgdata", "lake", "mlartifacts"} <= set(doc["volumes"])


def _compose_command() -> list[str] | None:
    """A working compose command: docker-compose, or docker's compose plugin (a docker CLI may lack it)."""
    for exe in (["docker-compose"], ["docker", "compose"]):
        if shutil.which(exe[0]):
            try:
                if subprocess.run([*exe, "version"], capture_output=True, timeout=30).returncode == 0:
                    return exe
            except (OSError, subprocess.TimeoutExpired):
                pass
    return None


COMPOSE_CMD = _compose_command()


@pytest.mark.skipif(COMPOSE_CMD is None, reason="no working compose: neither docker-compose nor docker's compose "
                    "plugin (apt-get install docker-compose)")
def test_compose_config_validates(tmp_path):
    exe = COMPOSE_CMD
    ok = subprocess.run([*exe, "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    broken = tmp_path / "docker-compose.yaml"  # the validator really checks: a bad condition is refused
    broken.write_text(COMPOSE.read_text().replace("service_healthy", "service_healty", 1))
    bad = subprocess.run([*exe, "-f", str(broken), "config", "-q"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "service_healty" in (bad.stderr + bad.stdout)
