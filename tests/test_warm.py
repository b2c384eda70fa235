"""The warm server (lab/warm.py): jobs forked from a process with the heavy modules already imported
behave like `python -m` subprocesses (exit code, output, environment, working directory, kill), refuse an
environment the preload has already read, and carry a real training run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from lab import warm

PROBE = textwrap.dedent("""
    import os, sys
    print("preloaded" if "json" in sys.modules else "cold", os.environ.get("PROBE"), os.getcwd(), sys.argv[1:])
    print("to stderr", file=sys.stderr)
    if sys.argv[1] == "sleep":
        import time
        time.sleep(120)
    if sys.argv[1] == "stubborn":  # like `airflow dags test`: handles SIGTERM and carries on
        import signal, subprocess, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        kid = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"])
        print("kid", kid.pid, flush=True)
        time.sleep(120)
    if sys.argv[1] == "boom":
        raise ValueError("boom")
    sys.exit(int(sys.argv[1]))
""")


@pytest.fixture
def server(tmp_path):
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "warmprobe.py").write_text(PROBE)
    env = dict(os.environ) | {"PYTHONPATH": str(tmp_path / "mods")}
    env.pop(warm.SOCKET_ENV, None)
    log = tmp_path / "warm.log"
    proc, sock = warm.start_server(env, log, preload=["json"])
    warm.wait_ready(proc, sock, log, timeout_s=60)
    yield env | {warm.SOCKET_ENV: str(sock)}, log
    warm.stop_server(proc, sock)
    assert not sock.parent.exists()


def _run(env, *args, cwd="/"):
    p = warm.popen([sys.executable, "-m", "warmprobe", *args], env, cwd, stdout=subprocess.PIPE,
                   stderr=subprocess.STDOUT, text=True)
    return p, p.stdout.read(), p.wait(timeout=30)


def test_a_job_behaves_like_python_dash_m(server, tmp_path):
    env, log = server
    p, out, rc = _run(env | {"PROBE": "hello"}, "3", cwd=str(tmp_path))
    assert isinstance(p, warm.WarmPopen) and rc == 3
    assert f"hello {tmp_path} ['3']" in out and "to stderr" in out
    assert out.startswith("preloaded")  # forked after the preload: the module is already there
    assert "python -m warmprobe 3" in log.read_text()
    p, out, rc = _run(env, "boom")
    assert rc == 1 and "ValueError: boom" in out


def test_a_job_is_killed_by_its_process_group_and_the_server_lives_on(server):
    env, _ = server
    p = warm.popen([sys.executable, "-m", "warmprobe", "sleep"], env, "/", stdout=subprocess.PIPE,
                   stderr=subprocess.STDOUT, text=True)
    assert p.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(timeout=0.5)
    os.killpg(p.pid, signal.SIGKILL)
    assert p.wait(timeout=10) == -signal.SIGKILL
    assert _run(env, "0")[2] == 0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_a_stopping_server_kills_jobs_that_ignore_sigterm(tmp_path):
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "warmprobe.py").write_text(PROBE)
    env = dict(os.environ) | {"PYTHONPATH": str(tmp_path / "mods")}
    env.pop(warm.SOCKET_ENV, None)
    proc, sock = warm.start_server(env, tmp_path / "warm.log", preload=["json"], grace_s=1.0)
    try:
        warm.wait_ready(proc, sock, tmp_path / "warm.log", timeout_s=60)
        p = warm.popen([sys.executable, "-m", "warmprobe", "stubborn"], env | {warm.SOCKET_ENV: str(sock)}, "/",
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        kid = int(next(line for line in p.stdout if line.startswith("kid")).split()[1])
        assert _alive(p.pid) and _alive(kid)
        t0 = time.time()
    finally:
        warm.stop_server(proc, sock)
    assert proc.returncode == 0  # the server exited by itself, within stop()'s grace, not by SIGKILL
    deadline = time.time() + 10
    while (_alive(p.pid) or _alive(kid)) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(p.pid) and not _alive(kid), "a job that ignores SIGTERM outlived its server"
    assert time.time() - t0 < 15
    assert p.wait(timeout=5) == -signal.SIGKILL


def test_an_environment_the_preload_already_read_falls_back_to_a_fresh_process(server, capsys):
    env, _ = server
    p, out, rc = _run(env | {"AIRFLOW_HOME": "/elsewhere"}, "0")
    assert isinstance(p, subprocess.Popen) and rc == 0 and out.startswith("cold")
    assert "AIRFLOW_HOME" in capsys.readouterr().err
    p, out, rc = _run(env | {warm.SOCKET_ENV: "/nonexistent/sock"}, "5")
    assert isinstance(p, subprocess.Popen) and rc == 5


def test_a_source_edited_after_the_preload_falls_back_to_a_fresh_process(tmp_path, capsys):
    """An edit to preloaded code (here a small module; in practice rl_core during an experiment) makes the
    server refuse jobs: a fork would run the old module beside new code. The caller starts a fresh process."""
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "warmprobe.py").write_text(PROBE)
    lib = mods / "warmlib.py"
    lib.write_text("VERSION = 1\n")
    env = dict(os.environ) | {"PYTHONPATH": str(mods)}
    env.pop(warm.SOCKET_ENV, None)
    log = tmp_path / "warm.log"
    proc, sock = warm.start_server(env, log, preload=["json", "warmlib"])
    try:
        warm.wait_ready(proc, sock, log, timeout_s=60)
        env[warm.SOCKET_ENV] = str(sock)
        p, out, rc = _run(env, "0")
        assert isinstance(p, warm.WarmPopen) and out.startswith("preloaded")
        st = lib.stat()
        os.utime(lib, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        p, out, rc = _run(env, "4")
        assert isinstance(p, subprocess.Popen) and rc == 4 and out.startswith("cold")
        assert "warmlib.py changed since the preload" in capsys.readouterr().err
    finally:
        warm.stop_server(proc, sock)


def test_a_server_that_cannot_preload_says_why(tmp_path):
    log = tmp_path / "warm.log"
    proc, sock = warm.start_server(dict(os.environ), log, preload=["no_such_module_xyz"])
    try:
        with pytest.raises(RuntimeError, match="no_such_module_xyz"):
            warm.wait_ready(proc, sock, log, timeout_s=60)
    finally:
        warm.stop_server(proc, sock)


def test_the_airflow_cli_runs_as_a_warm_job(tmp_path):
    """`python -m airflow ...` (what rtrl experiment runs for `airflow dags test`) works from a server that
    imported Airflow under the same AIRFLOW_HOME."""
    env = dict(os.environ) | {"AIRFLOW_HOME": str(tmp_path / "airflow"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    env.pop(warm.SOCKET_ENV, None)
    log = tmp_path / "warm.log"
    proc, sock = warm.start_server(env, log, preload=["airflow", "airflow.cli.cli_parser"])
    try:
        warm.wait_ready(proc, sock, log, timeout_s=120)
        p = warm.popen([sys.executable, "-m", "airflow", "version"], env | {warm.SOCKET_ENV: str(sock)}, str(tmp_path),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out, rc = p.stdout.read(), p.wait(timeout=120)
    finally:
        warm.stop_server(proc, sock)
    import airflow

    assert isinstance(p, warm.WarmPopen) and rc == 0, out
    assert airflow.__version__ in out


@pytest.mark.slow
def test_a_training_run_forked_from_the_warm_server_matches_a_fresh_process(registered, monkeypatch, tmp_path):
    """The launcher's one-process trainer runs as a warm job and computes exactly what a fresh process does
    (same seeded data, same loss and KL at every step): the preload leaves no state behind that matters."""
    import json

    from lab.testing import synthetic
    from rl_core.lake import lake_from_config
    from rl_core.registry import store
    from rl_core.runtime import jobs
    from rl_core.train.launch import train

    cfg = registered
    lake = lake_from_config(cfg)
    for run_id in ("cycle-cold", "cycle-warm"):
        synthetic.make_run(lake, run_id, store.checkpoint_path(cfg, 1), n_prompts=2, per_prompt=2)
    monkeypatch.delenv(warm.SOCKET_ENV, raising=False)
    cold = train(cfg, "cycle-cold", 1)
    log = tmp_path / "warm.log"
    proc, sock = warm.start_server(dict(os.environ), log,
                                   preload=["torch", "deepspeed", "transformers", "rl_core.train.trainer"])
    try:
        warm.wait_ready(proc, sock, log, timeout_s=120)
        monkeypatch.setenv(warm.SOCKET_ENV, str(sock))
        jobs.use_launcher(warm.popen)  # what the server does for its forks; this process is not one of them
        t = time.time()
        s = train(cfg, "cycle-warm", 1)
        print(f"warm training run: {time.time() - t:.1f}s")
    finally:
        jobs.use_launcher(None)
        warm.stop_server(proc, sock)
    assert "python -m rl_core.train.trainer --spec" in log.read_text()
    assert s.status == cold.status == "ok" and s.steps == cold.steps >= 1

    def history(run_id):
        h = json.loads((cfg.models_dir / "runs" / run_id / "result.json").read_text())["history"]
        return [(r["loss"], r["kl"], r["is_weight_max"]) for r in h]

    assert history("cycle-warm") == history("cycle-cold")
