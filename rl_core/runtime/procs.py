"""Child processes of `rtrl cycle` / `rtrl experiment` (gateway, Airflow, MLflow UI, jobs): each runs in its own
session and is stopped by process group (stop_group), so nothing is left holding a port or a GPU; and what an
rtrl process writes is its user's alone (private_state: umask 077, the home 0700)."""

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

from rl_core.config import REPO_ROOT, Config


@contextlib.contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C while inside: `finally` blocks run and stop the children, which live in
    their own sessions and so never see a signal sent to us (a scheduler's kill, `timeout`, Airflow's on_kill
    of a task that runs `rtrl train`). Python's default SIGTERM ends the process without unwinding. The
    previous handler comes back on the way out (tests call the CLI in-process).
    The exit code stays 143 even when the unwinding trips: the SystemExit lands wherever the main thread was
    (inside an MLflow session, an import, a cleanup), and a `finally` there may raise something else in its
    place. A caller that got SIGTERM must still see "terminated", not a traceback's 1.
    Wherever it lands, no child outlives us: a SIGTERM inside subprocess.Popen (after the fork, before it
    returns) or between Popen and the `try` whose `finally` stops it leaves a child no cleanup knows of (a
    trainer holding its GPU, issue 44 item 8). So once the unwinding is done, every child this block started
    in a session of its own that is still there has its process group stopped (stop_new_children). A second
    SIGTERM while unwinding is ignored: it would cut short the cleanups the first one asked for."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers
        return
    got: list[int] = []
    before = session_children()

    def terminate(*_) -> None:
        if got:
            return  # already unwinding
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
        try:
            if got:
                stop_new_children(before)
        finally:
            signal.signal(signal.SIGTERM, previous)


def session_children() -> set[tuple[int, int]]:
    """(pid, start time) of this process's children that lead a process group of their own (started with
    start_new_session): the ones a signal to us never reaches. Linux /proc; empty elsewhere."""
    me, out = os.getpid(), set()
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return out
    for e in entries:
        try:
            with open(f"/proc/{e}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(b")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ... starttime (22nd)
        if int(fields[1]) == me and int(fields[2]) == int(e):
            out.add((int(e), int(fields[19])))
    return out


def stop_new_children(before: set[tuple[int, int]], grace_s: float = 5.0) -> list[int]:
    """Stop the process group of every session child that is not in `before` (session_children()), reaping
    the leaders (our children); returns their pids."""
    pids = sorted(pid for pid, _ in session_children() - before)

    def reap() -> None:
        for pid in pids:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)

    if pids:
        print(f"[rtrl] stopping process groups {pids} left running after SIGTERM", file=sys.stderr)
        stop_group(pids, grace_s, reap=reap)
    return pids


# --- this process's files: private state -----------------------------------------------------------------

# What rtrl creates under its home is its user's alone: the lake, the WAL and mlflow.db hold every organisation's
# raw traffic, and a sandboxed program (or any other uid on the host) must read none of it.
STATE_UMASK = 0o077


def private_state(cfg: Config | None = None, create_home: bool = False) -> int:
    """From now on every file and folder this process creates is its user's alone (umask 077: files 0600,
    folders 0700); with cfg, its home folder is 0700 too (make_home). Returns the previous umask. Each entry
    point calls it early: the `rtrl` command, the gateway process, the DAGs' task processes, `rtrl init`."""
    previous = os.umask(STATE_UMASK)
    if cfg is not None:
        make_home(cfg, create=create_home)
    return previous


def make_home(cfg: Config, create: bool = True) -> Path:
    """cfg's home folder, 0700: created so (when create), or tightened when it exists with wider modes and is
    ours (made by an older rtrl, or by hand), since what is inside is reached only through it. Left as it is
    when something near its top belongs to another account, whose server must still reach it (the dev stack's
    PostgreSQL cluster in stack/pg, made by an older rtrl as the `postgres` user): what rtrl writes in it from
    now on is private anyway (the umask)."""
    home = cfg.home_path
    if create:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        st = home.stat()
    except FileNotFoundError:
        return home  # made later by whatever writes first, under the umask
    if st.st_uid == os.geteuid() and st.st_mode & 0o077 and not _foreign_entries(home, st.st_uid):
        home.chmod(0o700)
    return home


def _foreign_entries(home: Path, uid: int, depth: int = 2) -> list[Path]:
    out, level = [], [home]
    for _ in range(depth):
        below = []
        for folder in level:
            with contextlib.suppress(OSError):
                for e in os.scandir(folder):
                    if e.stat(follow_symlinks=False).st_uid != uid:
                        out.append(Path(e.path))
                    elif e.is_dir(follow_symlinks=False):
                        below.append(Path(e.path))
        level = below
    return out


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


def serve_until_interrupted(procs: list[subprocess.Popen]) -> int:
    """Block until Ctrl-C / SIGTERM or until one process exits; then stop every group."""
    stopping: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):  # explicit: a background job inherits SIGINT ignored
        signal.signal(sig, lambda signum, _frame: stopping.append(signum))
    try:
        while not stopping and all(p.poll() is None for p in procs):
            time.sleep(0.5)
    finally:
        for p in procs:
            stop(p)
    return 0
