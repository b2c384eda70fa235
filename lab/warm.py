"""A warm Python: one long-lived process that has already imported the heavy modules forks a child per job.

Why: a cycle starts two short-lived Pythons, `airflow dags test` and the trainer, and each paid its imports
again (torch, DeepSpeed, transformers, Great Expectations, Airflow: ~10 s on 2 CPU cores, measured with the
imports cached), plus the DAG's first tasks paying them a second time. `rtrl experiment` runs cycles back
to back, so it starts one warm server for all of them, as it keeps one gateway.

Each job is still its own process: `python -m <module> <args>` semantics (runpy, `__main__`), its own session
(so a timeout kills its whole process group), its own stdio (file descriptors passed over the socket), the
caller's environment and working directory. A crash or a kill takes down the job, never the server.
The caller gets a `subprocess.Popen`-like handle (`WarmPopen`); `popen()` uses the server named by
RTRL_WARM_SOCKET when there is one and falls back to a plain subprocess otherwise. The server installs it as
its forks' job launcher (rl_core.runtime.jobs.use_launcher), so a forked DAG run's trainer is a warm fork too.
Lab only: production never names a socket, and the product never imports this module.

Fork safety: the server stays single-threaded (it is refused otherwise) and forks before any job work, so
no lock or thread pool is copied mid-use. Modules read some settings at import (Airflow its config), so a
job whose Airflow config (AIRFLOW_HOME, AIRFLOW__*), DS_ACCELERATOR or HF_* environment differs from the server's is refused and runs as a plain subprocess.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from rl_core.runtime import SOCKET_ENV
from rl_core.runtime import jobs as jobs_mod
from rl_core.runtime.procs import start, stop, stop_group

PRELOAD = ["torch", "deepspeed", "transformers", "great_expectations", "mlflow", "airflow", "airflow.sdk",
           "airflow.cli.cli_parser", "duckdb", "pyarrow.parquet", "rl_core.train.trainer",
           # `import transformers` is lazy: the Auto classes and the model code load on first use, 2.3-2.7 s in
           # each job that loads a model (the eval task, the trainer), so they are imported here too
           "transformers.models.auto.modeling_auto", "transformers.models.auto.tokenization_auto",
           "transformers.models.llama.modeling_llama"]
_HEADER = struct.Struct("!Q")
JOB_GRACE_S = 10.0  # a stopping server's jobs get this long after SIGTERM; below stop()'s 20 s for the server


class WarmUnavailable(RuntimeError):
    """No warm server answered, or it refused the job: run a plain subprocess instead."""


PINNED = ("AIRFLOW_HOME", "AIRFLOW__", "AIRFLOW_CONFIG", "DS_ACCELERATOR", "HF_HUB_OFFLINE", "HF_HOME",
          "TRANSFORMERS_")


def _pinned(env: dict[str, str]) -> dict[str, str]:
    """The environment the preloaded modules have already read (Airflow's config, DeepSpeed's accelerator,
    Hugging Face's offline switch): a job must match it. A task's AIRFLOW_CTX_* context is not config."""
    return {k: v for k, v in env.items() if k.startswith(PINNED)}


# --- the server ------------------------------------------------------------------------------------

def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("client went away")
        buf += chunk
    return buf


def _child(req: dict, fds: list[int], inherited: list[socket.socket]) -> None:
    """Runs in the forked child: become `python -m module args` and never return."""
    code = 1
    try:
        for s in inherited:  # the server's sockets: a job must not keep them (or a client waiting) open
            s.close()
        os.setsid()
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in zip((0, 1, 2), fds, strict=True):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdout.reconfigure(line_buffering=True)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        for p in reversed([req["cwd"], *filter(None, req["env"].get("PYTHONPATH", "").split(os.pathsep))]):
            if p not in sys.path:
                sys.path.insert(0, p)
        if "torch" in sys.modules and req["env"].get("OMP_NUM_THREADS", "").isdigit():
            sys.modules["torch"].set_num_threads(int(req["env"]["OMP_NUM_THREADS"]))
        import runpy
        import warnings

        warnings.filterwarnings("ignore", message=".*found in sys.modules after import of package",
                                category=RuntimeWarning)  # runpy re-running a preloaded module as __main__
        sys.argv = [req["module"], *req["args"]]
        try:
            runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, int | None):
                print(e.code, file=sys.stderr)
        import atexit

        atexit._run_exitfuncs()  # what a normal interpreter exit runs (Airflow disposes its ORM there)
    except BaseException:  # noqa: BLE001 - report anything, then leave with a failing code
        import traceback

        traceback.print_exc()
    finally:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)


def serve(sock_path: Path, preload: list[str], grace_s: float = JOB_GRACE_S) -> None:
    """Import `preload`, then fork one child per request until SIGTERM; the socket appears once warm. On SIGTERM
    the jobs get grace_s to exit, then SIGKILL."""
    t0 = time.time()
    for mod in preload:
        importlib.import_module(mod)
    jobs_mod.use_launcher(popen)  # every fork's trainer starts warm too (rl_core.runtime.jobs)
    if threading.active_count() != 1:
        raise SystemExit(f"warm: {threading.active_count()} threads after the preload; forking would be unsafe")
    print(f"[warm] imported {', '.join(preload)} in {time.time() - t0:.1f}s; pid {os.getpid()}", flush=True)
    pinned, stamp = _pinned(dict(os.environ)), _sources()
    sock_path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = sock_path.with_name(sock_path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    listener.bind(str(tmp))
    listener.listen(16)
    os.replace(tmp, sock_path)  # clients see the socket only when it accepts
    jobs: dict[int, socket.socket] = {}
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    try:
        while not stopping:
            try:
                ready, _, _ = select.select([listener], [], [], 0.2)
            except InterruptedError:
                continue
            if ready:
                conn, _ = listener.accept()
                try:
                    pid = _start_job(conn, [listener, *jobs.values()], pinned, stamp)
                    if pid:
                        jobs[pid] = conn
                    else:
                        conn.close()
                except (OSError, ValueError) as e:
                    print(f"[warm] bad request: {e}", flush=True)
                    conn.close()
            _reap(jobs)
    finally:  # a job outliving its server would hold ports and files nobody waits on, and some jobs handle
        # SIGTERM themselves and linger (`airflow dags test` did): all groups at once, each job's exit code sent
        stop_group(list(jobs), grace_s, reap=lambda: _reap(jobs))
        listener.close()
        sock_path.unlink(missing_ok=True)


def _sources() -> dict[str, int]:
    """mtime of the source of every imported module outside the interpreter's own folders (the project's
    code, whatever the preload pulled in). Why: a job forked after one of them was edited would run the
    preloaded old code beside new code it imports fresh (measured: an edit during `rtrl experiment` gave
    the DAG's operator a new helper that the server's old warm module did not have)."""
    skip = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})
    out = {}
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if isinstance(f, str) and f.endswith(".py") and not f.startswith(skip):
            try:
                out[f] = os.stat(f).st_mtime_ns
            except OSError:
                pass
    return out


def _changed(stamp: dict[str, int]) -> str | None:
    """The first preloaded source that changed (or vanished) since the preload, else None."""
    for f, t in stamp.items():
        try:
            if os.stat(f).st_mtime_ns != t:
                return f
        except OSError:
            return f
    return None


def _start_job(conn: socket.socket, others: list[socket.socket], pinned: dict[str, str],
               stamp: dict[str, int]) -> int:
    conn.settimeout(10)
    head, fds, _, _ = socket.recv_fds(conn, _HEADER.size, 3)
    try:
        req = json.loads(_recv_exact(conn, _HEADER.unpack(head)[0]))
        if len(fds) != 3:
            raise ValueError(f"expected 3 file descriptors (stdin, stdout, stderr), got {len(fds)}")
        if _pinned(req["env"]) != pinned:
            diff = sorted(set(_pinned(req["env"]).items()) ^ set(pinned.items()))
            conn.sendall(json.dumps({"error": f"environment differs from the server's: {diff[:4]}"})
                         .encode() + b"\n")
            return 0
        changed = _changed(stamp)
        if changed:
            conn.sendall(json.dumps({"error": f"{changed} changed since the preload (old and new code would mix)"})
                         .encode() + b"\n")
            return 0
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(req, fds, [conn, *others])
    finally:
        for fd in fds:
            os.close(fd)
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    print(f"[warm] job {pid}: python -m {req['module']} {' '.join(req['args'])[:200]}", flush=True)
    return pid


def _reap(jobs: dict[int, socket.socket]) -> None:
    while jobs:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = jobs.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(json.dumps({"rc": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            except OSError:
                pass  # the caller went away; the job is over anyway
            conn.close()


# --- the caller's side -----------------------------------------------------------------------------

class WarmPopen:
    """The part of subprocess.Popen that rtrl uses (pid, stdout, poll, wait, returncode), for a warm job."""

    def __init__(self, sock_path: str, module: str, args: list[str], env: dict[str, str], cwd: str | Path,
                 stdout=None, stderr=None):
        self.args = [sys.executable, "-m", module, *args]
        self.returncode: int | None = None
        self.stdout = None
        self._buf = b""
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(sock_path)
        except OSError as e:
            self._sock.close()
            raise WarmUnavailable(f"no warm server at {sock_path}: {e}") from e
        close_after: list[int] = [os.open(os.devnull, os.O_RDONLY)]
        if stdout == subprocess.PIPE:
            r, w = os.pipe()
            self.stdout = open(r, encoding="utf-8", errors="replace")  # noqa: SIM115 - closed by the caller's loop
            out = w
            close_after.append(w)
        else:
            out = stdout.fileno() if stdout is not None else 1
        err = out if stderr == subprocess.STDOUT else (stderr.fileno() if stderr is not None else 2)
        payload = json.dumps({"module": module, "args": list(args), "env": dict(env), "cwd": str(cwd)}).encode()
        try:
            socket.send_fds(self._sock, [_HEADER.pack(len(payload))], [close_after[0], out, err])
            self._sock.sendall(payload)
            reply = json.loads(self._line(timeout=30))
        except (OSError, ValueError, subprocess.TimeoutExpired) as e:
            self._sock.close()
            raise WarmUnavailable(f"warm server at {sock_path} did not start the job: {e}") from e
        finally:
            for fd in close_after:
                os.close(fd)
        if "error" in reply:
            self._sock.close()
            raise WarmUnavailable(reply["error"])
        self.pid: int = reply["pid"]

    def _line(self, timeout: float | None) -> bytes:
        deadline = None if timeout is None else time.time() + timeout
        while b"\n" not in self._buf:
            left = None if deadline is None else max(deadline - time.time(), 0.0)
            if not select.select([self._sock], [], [], left)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            chunk = self._sock.recv(4096)
            if not chunk:
                return b'{"rc": 255}'  # the server died under the job
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = int(json.loads(self._line(timeout))["rc"])
            self._sock.close()
        return self.returncode

    def poll(self) -> int | None:
        try:
            return self.wait(timeout=0)
        except subprocess.TimeoutExpired:
            return None


def python_module(cmd: list[str]) -> tuple[str, list[str]] | None:
    """("mod", args) when cmd is `<this python> -m mod args`, else None."""
    if len(cmd) >= 3 and cmd[1] == "-m" and Path(cmd[0]).name.startswith("python"):
        return cmd[2], cmd[3:]
    return None


def popen(cmd: list[str], env: dict[str, str], cwd: str | Path, stdout=None, stderr=None,
          **popen_kw) -> subprocess.Popen | WarmPopen:
    """A warm job when env names a warm server and cmd is `python -m ...`, else subprocess.Popen(cmd).
    The child runs in its own session either way (kill it with os.killpg(proc.pid, ...))."""
    sock, mod = env.get(SOCKET_ENV), python_module(cmd)
    if sock and mod:
        try:
            return WarmPopen(sock, mod[0], mod[1], env, cwd, stdout=stdout, stderr=stderr)
        except WarmUnavailable as e:
            print(f"[warm] {e}; starting a fresh process", file=sys.stderr)
    return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=stdout, stderr=stderr, start_new_session=True,
                            **popen_kw)


def start_server(env: dict[str, str], log: Path, preload: list[str] | None = None,
                 grace_s: float = JOB_GRACE_S) -> tuple[subprocess.Popen, Path]:
    """Start `python -m lab.warm` on a fresh socket; returns at once (see wait_ready)."""
    sock = Path(tempfile.mkdtemp(prefix="rtrl-warm-")) / "sock"  # short: UNIX socket paths stop at ~108 bytes
    proc = start([sys.executable, "-m", "lab.warm", "--socket", str(sock),
                  "--preload", ",".join(PRELOAD if preload is None else preload), "--grace", str(grace_s)], env, log)
    return proc, sock


def wait_ready(proc: subprocess.Popen, sock: Path, log: Path, timeout_s: float = 180.0) -> None:
    """Wait until the server's socket accepts (the preload takes ~10 s here); raise with its log if it died."""
    deadline = time.time() + timeout_s
    while not sock.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"warm server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        if time.time() > deadline:
            raise TimeoutError(f"warm server not ready within {timeout_s:.0f}s (log {log})")
        time.sleep(0.2)


def stop_server(proc: subprocess.Popen | None, sock: Path | None) -> None:
    stop(proc)
    if sock is not None:
        shutil.rmtree(sock.parent, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="rtrl warm server: preload modules, fork a child per job")
    ap.add_argument("--socket", required=True, type=Path, help="UNIX socket path to listen on")
    ap.add_argument("--preload", default=",".join(PRELOAD), help="comma-separated modules to import first")
    ap.add_argument("--grace", type=float, default=JOB_GRACE_S, help="seconds jobs get after SIGTERM before SIGKILL")
    a = ap.parse_args(argv)
    serve(a.socket, [m for m in a.preload.split(",") if m], a.grace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
