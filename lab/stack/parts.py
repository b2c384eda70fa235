"""`rtrl stack up|down|status|env` / `make stack`: the production topology on this machine, without docker.

    postgres        Debian's PostgreSQL, one cluster in var/stack/pg: Airflow's and MLflow's databases
    redis           Debian's redis-server: the Celery broker
    s3              an S3 endpoint (moto's server, lab/stack/s3server.py): the lake (s3://rtrl-lake/lake)
                    and MLflow's artifacts
    mlflow          the tracking server and registry on PostgreSQL, artifacts proxied to s3://rtrl-mlflow
    airflow-*       api-server (UI, REST v2, execution API), scheduler (CeleryExecutor), dag-processor,
                    triggerer, and two Celery workers that run the tasks
    init            one-shot: the base model registered as version 1 in the MLflow server (`rtrl init`)

Each part starts in its own session, in this order, once the parts before it answer their health checks;
`down` stops them in reverse order by process group. Logs are in var/stack/logs/, process groups in
var/stack/pids/. `up` is idempotent: a part that answers is left alone. The stack's processes read rtrl's
production settings from the environment that `rtrl stack env` prints (the lake on S3, the MLflow server),
so `eval "$(rtrl stack env)"` points any rtrl command (`rtrl serve`, `rtrl simulate`) at the stack.

moto keeps its objects in the server process (spooled to var/stack/s3 above 5 MB): `down` loses the lake and
the artifacts while PostgreSQL keeps the registry;
`down --purge` removes var/stack so the next `up` starts clean. Production points AWS_ENDPOINT_URL at nothing
(real S3) and the URIs at managed servers; the code path (s3fs, DuckDB through it, MLflow's S3 store) is the same.
"""

from __future__ import annotations

import base64
import glob
import hashlib
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from lab.airflow import airflow_env, bin_path
from rl_core.config import REPO_ROOT, Config, load_config
from rl_core.ids import mlflow_filter_value
from rl_core.runtime.procs import answers, free_port

LAKE_BUCKET, MLFLOW_BUCKET = "rtrl-lake", "rtrl-mlflow"
DB_USER = "rtrl"
WORKERS = ("worker1", "worker2")


class StackError(RuntimeError):
    """A part cannot be set up or started; the message says which and why."""


@dataclass(frozen=True)
class Ports:
    postgres: int = 15432
    redis: int = 15379
    s3: int = 15900
    mlflow: int = 15500
    airflow: int = 15808
    worker_logs: int = 15793  # one log server per worker: worker_logs + i

    @classmethod
    def free(cls) -> Ports:
        """Free ports (tests run a stack beside a developer's)."""
        return cls(*(free_port() for _ in range(5)), worker_logs=free_port())


@dataclass(frozen=True)
class Stack:
    root: Path  # var/stack
    ports: Ports = field(default_factory=Ports)

    @classmethod
    def from_config(cls, cfg: Config) -> Stack:
        return cls(cfg.home_path / "stack")

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def home(self) -> Path:
        """RTRL_HOME of the stack's processes (model cache, checkpoints, the gateway's write-ahead log)."""
        return self.root / "home"

    @property
    def airflow_home(self) -> Path:
        return self.root / "airflow"

    def db_url(self, db: str, driver: str = "postgresql+psycopg2") -> str:
        return f"{driver}://{DB_USER}@127.0.0.1:{self.ports.postgres}/{db}"

    @property
    def mlflow_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.mlflow}"

    @property
    def airflow_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.airflow}"

    def airflow_api(self, timeout: float = 30, wait_for: str | None = None, wait_s: float = 300) -> httpx.Client:
        """A client of Airflow's REST API (/api/v2) signed in as the simple auth manager's admin; with wait_for,
        once the dag-processor has parsed that DAG (StackError after wait_s, with its log's tail)."""
        password = json.loads((self.airflow_home / "simple_auth_manager_passwords.json.generated").read_text())
        token = httpx.post(f"{self.airflow_url}/auth/token", json={"username": "admin", "password": password["admin"]},
                           timeout=timeout).json()["access_token"]
        client = httpx.Client(base_url=f"{self.airflow_url}/api/v2", headers={"Authorization": f"Bearer {token}"},
                              timeout=timeout)
        deadline = time.monotonic() + wait_s
        while wait_for and client.get(f"/dags/{wait_for}").status_code != 200:
            if time.monotonic() > deadline:
                log = (self.logs / "airflow-dag-processor.log").read_text()[-3000:]
                raise StackError(f"the dag-processor did not parse {wait_for} in {wait_s:.0f} s:\n{log}")
            time.sleep(2)
        return client

    @property
    def s3_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.s3}"

    def env(self) -> dict[str, str]:
        """rtrl's production settings for a process that uses the stack (`rtrl stack env` prints these)."""
        return {
            "RTRL_HOME": str(self.home),
            "RTRL_LAKE__ROOT": f"s3://{LAKE_BUCKET}/lake",
            "RTRL_MLFLOW__TRACKING_URI": self.mlflow_url,
            "AWS_ENDPOINT_URL": self.s3_url,  # botocore, s3fs and MLflow's S3 store all honour it
            "AWS_ACCESS_KEY_ID": "rtrl-stack",
            "AWS_SECRET_ACCESS_KEY": "rtrl-stack",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def secrets(self) -> dict[str, str]:
        """The JWT secret and Fernet key every Airflow process must share, made once per stack."""
        path = self.root / "secrets.json"
        if not path.is_file():
            self.root.mkdir(parents=True, exist_ok=True)
            made = {"jwt": base64.urlsafe_b64encode(os.urandom(32)).decode(),
                    "fernet": base64.urlsafe_b64encode(os.urandom(32)).decode()}
            path.write_text(json.dumps(made))
            path.chmod(0o600)
        return json.loads(path.read_text())

    def airflow_env(self) -> dict[str, str]:
        cfg = load_config(environ={**os.environ, **self.env()})
        s = self.secrets()
        return airflow_env(cfg, **self.env(), **{
            "AIRFLOW_HOME": str(self.airflow_home),
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CORE__PARALLELISM": "8",
            "AIRFLOW__CORE__FERNET_KEY": s["fernet"],
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.airflow_url}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__API__PORT": str(self.ports.airflow),
            "AIRFLOW__API__BASE_URL": self.airflow_url,
            "AIRFLOW__API_AUTH__JWT_SECRET": s["jwt"],
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.db_url("airflow"),
            "AIRFLOW__CELERY__BROKER_URL": f"redis://127.0.0.1:{self.ports.redis}/0",
            "AIRFLOW__CELERY__RESULT_BACKEND": self.db_url("airflow", "db+postgresql+psycopg2"),  # SQLAlchemy 2.1 defaults to psycopg 3
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": "2",
        })


# --- the parts ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Part:
    name: str
    argv: Callable[[Stack], list[str]]
    healthy: Callable[[Stack], bool]
    env: Callable[[Stack], dict[str, str]] = lambda s: dict(os.environ)
    prepare: Callable[[Stack], None] = lambda s: None  # before the start (idempotent)
    ready: Callable[[Stack], None] = lambda s: None  # after the first healthy answer (idempotent)
    user: Callable[[], str | None] = lambda: None  # run as this user (PostgreSQL refuses root)
    start_s: float = 120.0  # how long the health check may take after the start


def _pg_bin(name: str) -> str:
    """A PostgreSQL server binary: Debian's newest /usr/lib/postgresql/<v>/bin, else PATH."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    path = found[-1] if found else shutil.which(name)
    if not path:
        raise StackError(f"PostgreSQL's {name} not found: install Debian's postgresql package (make stack does)")
    return path


def _pg_user() -> str | None:
    """PostgreSQL refuses to run as root: as root, its files and processes belong to the `postgres` user."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError as exc:
        raise StackError("running as root needs the `postgres` user (Debian's postgresql package makes it)") from exc
    return "postgres"


def _pg_data(s: Stack) -> Path:
    """var/stack/pg, or, when the postgres user cannot reach it (a checkout under /root), a folder it owns
    with var/stack/pg as a link to it."""
    data = s.root / "pg"
    user = _pg_user()
    if user is None or data.exists():
        return data.resolve()
    data.parent.mkdir(parents=True, exist_ok=True)
    reachable = all(os.stat(p).st_mode & 0o001 for p in [*reversed(data.parent.parents), data.parent])
    if reachable:
        return data
    outside = Path("/var/lib/postgresql") / f"rtrl-stack-{hashlib.sha256(str(s.root.resolve()).encode()).hexdigest()[:12]}"
    outside.mkdir(parents=True, exist_ok=True)
    data.symlink_to(outside)
    return outside


def _pg_prepare(s: Stack) -> None:
    data = _pg_data(s)
    if (data / "PG_VERSION").is_file():
        return
    data.mkdir(parents=True, exist_ok=True)
    user = _pg_user()
    if user:
        shutil.chown(data, user, user)
    data.chmod(0o700)
    subprocess.run([_pg_bin("initdb"), "-D", str(data), "-U", DB_USER, "--auth=trust", "-E", "UTF8", "--locale=C"],
                   check=True, capture_output=True, text=True, user=user, cwd="/")


def _pg_argv(s: Stack) -> list[str]:
    return [_pg_bin("postgres"), "-D", str(_pg_data(s)), "-p", str(s.ports.postgres), "-c", "listen_addresses=127.0.0.1",
            "-c", "unix_socket_directories=", "-c", "max_connections=300", "-c", "shared_buffers=128MB"]


def _pg_connect(s: Stack, db: str = "postgres"):
    import psycopg2

    return psycopg2.connect(host="127.0.0.1", port=s.ports.postgres, user=DB_USER, dbname=db, connect_timeout=3)


def _pg_healthy(s: Stack) -> bool:
    try:
        _pg_connect(s).close()
        return True
    except Exception:  # noqa: BLE001  psycopg2.OperationalError while it starts; any failure is "not up"
        return False


def _pg_ready(s: Stack) -> None:
    con = _pg_connect(s)
    con.autocommit = True
    with con.cursor() as cur:
        for db in ("airflow", "mlflow"):
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,))
            if cur.fetchone() is None:
                cur.execute(f'CREATE DATABASE "{db}"')
    con.close()


def _redis_healthy(s: Stack) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", s.ports.redis), timeout=2) as c:
            c.sendall(b"PING\r\n")
            return c.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _redis_argv(s: Stack) -> list[str]:
    (s.root / "redis").mkdir(parents=True, exist_ok=True)
    return [shutil.which("redis-server") or "/usr/bin/redis-server", "--port", str(s.ports.redis), "--bind", "127.0.0.1",
            "--dir", str(s.root / "redis"), "--save", "", "--appendonly", "no"]


def _s3_env(s: Stack) -> dict[str, str]:
    """moto spools every object over 5 MB to a temp file: under var/stack/s3, which `down --purge` removes."""
    (s.root / "s3").mkdir(parents=True, exist_ok=True)
    return {**os.environ, "TMPDIR": str(s.root / "s3")}


def _s3_ready(s: Stack) -> None:
    import boto3

    c = boto3.client("s3", endpoint_url=s.s3_url, aws_access_key_id="rtrl-stack", aws_secret_access_key="rtrl-stack",
                     region_name="us-east-1")
    have = {b["Name"] for b in c.list_buckets().get("Buckets", [])}
    for bucket in (LAKE_BUCKET, MLFLOW_BUCKET):
        if bucket not in have:
            c.create_bucket(Bucket=bucket)


def _mlflow_argv(s: Stack) -> list[str]:
    return [bin_path("mlflow"), "server", "--backend-store-uri", s.db_url("mlflow"),
            "--artifacts-destination", f"s3://{MLFLOW_BUCKET}/artifacts", "--serve-artifacts",
            "--host", "127.0.0.1", "--port", str(s.ports.mlflow), "--workers", "2"]


def _mlflow_env(s: Stack) -> dict[str, str]:
    # job execution (huey consumers, ~2 GB) serves MLflow's GenAI scorers, which rtrl does not use
    return {**os.environ, **s.env(), "MLFLOW_S3_ENDPOINT_URL": s.s3_url, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def _airflow_prepare(s: Stack) -> None:
    """`airflow db migrate` and the training pool (idempotent), before the api-server starts."""
    env = s.airflow_env()
    cfg = load_config(environ=env)
    s.airflow_home.mkdir(parents=True, exist_ok=True)
    for argv in (["db", "migrate"], ["pools", "set", cfg.airflow.training_pool, str(cfg.airflow.training_pool_slots),
                                     "GPU/CPU-heavy rtrl tasks: training and eval"]):
        done = subprocess.run([bin_path("airflow"), *argv], env=env, capture_output=True, text=True, cwd=REPO_ROOT)
        if done.returncode != 0:
            raise StackError(f"airflow {' '.join(argv)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def _airflow_health(s: Stack) -> dict:
    try:
        with urllib.request.urlopen(f"{s.airflow_url}/api/v2/monitor/health", timeout=3) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return {}


def _component_healthy(component: str) -> Callable[[Stack], bool]:
    return lambda s: (_airflow_health(s).get(component) or {}).get("status") == "healthy"


def _worker_argv(i: int) -> Callable[[Stack], list[str]]:
    return lambda s: [bin_path("airflow"), "celery", "worker", "--celery-hostname", f"{WORKERS[i]}@%h",
                      "--pid", str(s.pids / f"{WORKERS[i]}.celery.pid"), "--concurrency", "2"]


def _worker_env(i: int) -> Callable[[Stack], dict[str, str]]:
    return lambda s: {**s.airflow_env(), "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(s.ports.worker_logs + i)}


def worker_healthy(s: Stack, name: str) -> bool:
    """The worker answers a Celery ping through the broker (the way Airflow's own health check asks)."""
    from celery import Celery

    app = Celery(broker=f"redis://127.0.0.1:{s.ports.redis}/0")
    try:
        replies = app.control.ping(destination=[f"{name}@{socket.gethostname()}"], timeout=2.0)
    except Exception:  # noqa: BLE001  the broker not answering means the worker is not reachable either
        return False
    finally:
        app.close()
    return bool(replies)


def init_done(s: Stack) -> bool:
    try:
        from mlflow import MlflowClient  # lazy: heavy (mlflow)

        cfg = load_config(environ={**os.environ, **s.env()})
        # the registry named too: MlflowClient otherwise takes the process-wide one (mlflow.set_registry_uri)
        c = MlflowClient(tracking_uri=s.mlflow_url, registry_uri=s.mlflow_url)
        return bool(c.search_model_versions(f"name={mlflow_filter_value(cfg.mlflow.model_name)}"))
    except Exception:  # noqa: BLE001  a server that does not answer is "not done"
        return False


def register_base(s: Stack) -> None:
    done = subprocess.run([bin_path("rtrl"), "init", "--no-check"], env={**os.environ, **s.env()}, cwd=REPO_ROOT,
                          capture_output=True, text=True)
    (s.logs / "init.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise StackError(f"rtrl init failed (log {s.logs / 'init.log'}):\n{done.stderr[-2000:]}")


PARTS: tuple[Part, ...] = (
    Part("postgres", _pg_argv, _pg_healthy, prepare=_pg_prepare, ready=_pg_ready, user=_pg_user),
    Part("redis", _redis_argv, _redis_healthy),
    Part("s3", lambda s: [sys.executable, "-m", "lab.stack.s3server", "-H", "127.0.0.1", "-p", str(s.ports.s3)],
         lambda s: answers(f"{s.s3_url}/moto-api/"), env=_s3_env, ready=_s3_ready),
    Part("mlflow", _mlflow_argv, lambda s: answers(f"{s.mlflow_url}/health"), env=_mlflow_env, start_s=180),
    Part("airflow-apiserver", lambda s: [bin_path("airflow"), "api-server", "--port", str(s.ports.airflow)],
         lambda s: _component_healthy("metadatabase")(s), env=Stack.airflow_env, prepare=_airflow_prepare, start_s=240),
    Part("airflow-scheduler", lambda s: [bin_path("airflow"), "scheduler"], _component_healthy("scheduler"),
         env=Stack.airflow_env, start_s=180),
    Part("airflow-dag-processor", lambda s: [bin_path("airflow"), "dag-processor"], _component_healthy("dag_processor"),
         env=Stack.airflow_env, start_s=180),
    Part("airflow-triggerer", lambda s: [bin_path("airflow"), "triggerer"], _component_healthy("triggerer"),
         env=Stack.airflow_env, start_s=180),
    *(Part(f"airflow-{w}", _worker_argv(i), lambda s, w=w: worker_healthy(s, w), env=_worker_env(i), start_s=180)
      for i, w in enumerate(WORKERS)),
)


