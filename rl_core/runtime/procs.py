"""Child processes of `rtrl cycle` / `rtrl experiment` (gateway, Airflow, MLflow UI, jobs): each runs in its own
session and is stopped by process group (stop_group), so nothing is left holding a port or a GPU."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rl_core.config import REPO_ROOT


@contextlib.contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C while inside: `finally` blocks run and stop the children, which live in
    their own sessions and so never see a signal sent to us (a scheduler's kill, `timeout`, Airflow's on_kill
    of a task that runs `rtrl train`). Python's default SIGTERM ends the process without unwinding. The
    previous handler comes back on the way out (tests call the CLI in-process).
    The exit code stays 143 even when the unwinding trips: the SystemExit lands wherever the main thread was
    (inside an MLflow session, an import, a cleanup), and a `finally` there may raise something else in its
    place. A caller that got SIGTERM must still see "terminated", not a traceback's 1."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers
        return
    got: list[int] = []

    def terminate(*_) -> None:
        got.append(1)
        sys.exit(143)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    except Exception as exc:
        if not got:
            raise
        print(f"[rtrl] stopping after SIGTERM, the unwinding raised {type(exc).__name__}: {exc}", file=sys.stderr)
        raise SystemExit(143) from exc
    finally:
        signal.signal(signal.SIGTERM, previous)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(argv: list[str], env: dict[str, str], log: Path, user: str | None = None) -> subprocess.Popen:
    """argv in a new session (its own process group), output appended to log; user: run as this user (root only;
    it starts in / since the checkout may be out of its reach)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd="/" if user else REPO_ROOT, user=user)


def group_alive(pgid: int) -> bool:
    """Is any process left in the group? An unreaped (zombie) leader counts: reap it first."""
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _signal_groups(pgids: list[int], sig: int) -> None:
    for g in pgids:
        try:
            os.killpg(g, sig)
        except ProcessLookupError:
            pass


def stop_group(target: Any, grace_s: float = 20.0, *, kill_wait_s: float = 5.0,
               reap: Callable[[], object] | None = None) -> bool:
    """SIGTERM the process group(s), wait up to grace_s for them to empty, SIGKILL what is left, wait up to
    kill_wait_s more. Returns whether anything needed SIGKILL; grace_s <= 0 skips SIGTERM.

    target: a Popen-like (its leader is reaped here with poll()), a process group id, a list of these, or None.
    A bare id is only signalled and watched, because a zombie leader keeps its group alive: pass reap when
    the leader is your child (the warm server's jobs), leave it out when another thread waits on it (a job's
    deadline timer; a WarmPopen read from two threads would split its exit code).
    Why one function: every caller (services, warm jobs, the trainer's deadline and on_kill, vLLM) had its own
    loop, and they drifted (one skipped a group whose leader had exited but whose ranks had not)."""
    items = [] if target is None else list(target) if isinstance(target, list | tuple) else [target]
    procs = [t for t in items if not isinstance(t, int)]
    pgids = [t if isinstance(t, int) else t.pid for t in items]

    def settle(wait_s: float) -> list[int]:
        deadline = time.monotonic() + wait_s
        while True:
            for p in procs:
                p.poll()
            if reap is not None:
                reap()
            left = [g for g in pgids if group_alive(g)]
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.05)

    if grace_s > 0:
        _signal_groups(pgids, signal.SIGTERM)
    left = settle(max(grace_s, 0.0))
    if not left:
        return False
    _signal_groups(left, signal.SIGKILL)
    settle(kill_wait_s)
    return True


def stop(proc: subprocess.Popen | None, grace_s: float = 20.0) -> None:
    """Stop a service child (gateway, Airflow, MLflow UI, the warm server) and everything it started."""
    stop_group(proc, grace_s)


def answers(url: str, timeout_s: float = 5.0) -> bool:
    """Does url answer with anything but a server error?"""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.status < 500
    except OSError:
        return False


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before {url} answered:\n{tail}")
        if answers(url):
            return
        time.sleep(1.0)
    raise TimeoutError(f"{url} did not answer within {timeout_s:.0f}s")


@contextlib.contextmanager
def environ(over: dict[str, str]):
    """os.environ with over set, restored afterwards: the gateway and `airflow dags test` are subprocesses
    and read their config there (tests call the experiment in-process, so the caller's env comes back)."""
    saved = {k: os.environ.get(k) for k in over}
    os.environ.update(over)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
