"""Child processes of `rtrl cycle` / `rtrl experiment` (gateway, Airflow, MLflow UI): each runs in its own
session and is stopped by process group, so nothing is left holding a port or a GPU."""

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
from collections.abc import Iterator
from pathlib import Path

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


def start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """argv in a new session (its own process group), output appended to log."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=REPO_ROOT)


def stop(proc: subprocess.Popen | None, grace_s: float = 20.0) -> None:
    """SIGTERM the whole process group, SIGKILL what is left after grace_s (no orphans holding ports)."""
    if proc is None:
        return
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
            os.killpg(proc.pid, 0)  # the leader exited; are children of the group left?
        except ProcessLookupError:
            break
        except subprocess.TimeoutExpired:
            continue


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before {url} answered:\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status < 500:
                    return
        except OSError:
            pass
        time.sleep(1.0)
    raise TimeoutError(f"{url} did not answer within {timeout_s:.0f}s")
