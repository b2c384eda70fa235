"""`rtrl stack up|down|status|env`: start, stop and inspect the parts of lab/stack/parts.py.

Each part runs in its own session; its process group id is kept in var/stack/pids/<part>.pgid so that a later
`rtrl stack down` (another process) stops exactly what `up` started, children included.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

from lab.stack.parts import PARTS, Part, Stack, StackError, init_done, register_base
from rl_core.config import Config, load_config
from rl_core.runtime.procs import group_alive, start, stop_group

# the parts this process started (tests call up() and down() in-process): down() reaps them, else their zombie
# leaders would keep their groups "alive" until SIGKILL
_STARTED: dict[int, subprocess.Popen] = {}


def _pgid_file(s: Stack, part: Part) -> Path:
    return s.pids / f"{part.name}.pgid"


def running(s: Stack, part: Part) -> int | None:
    """The part's process group, if any process of it is alive."""
    f = _pgid_file(s, part)
    if not f.is_file():
        return None
    pgid = int(f.read_text())
    return pgid if group_alive(pgid) else None


def _tail(path: Path, n: int = 3000) -> str:
    return path.read_text(errors="replace")[-n:] if path.is_file() else ""


def _wait_healthy(s: Stack, part: Part, proc: subprocess.Popen | None, log: Path) -> None:
    deadline = time.monotonic() + part.start_s
    while not part.healthy(s):
        if proc is not None and proc.poll() is not None:
            raise StackError(f"{part.name} exited with {proc.returncode} before it was healthy ({log}):\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise StackError(f"{part.name} not healthy after {part.start_s:.0f} s ({log}):\n{_tail(log)}")
        time.sleep(1.0)


def start_part(s: Stack, part: Part) -> None:
    part.prepare(s)
    log = s.logs / f"{part.name}.log"
    s.pids.mkdir(parents=True, exist_ok=True)
    proc = start(part.argv(s), part.env(s), log, user=part.user())
    _pgid_file(s, part).write_text(str(proc.pid))
    _STARTED[proc.pid] = proc
    _wait_healthy(s, part, proc, log)


def up(s: Stack, say=print) -> None:
    """Start every part that does not answer, in order; then register the base model once."""
    t0 = time.monotonic()
    for part in PARTS:
        t = time.monotonic()
        if part.healthy(s):
            say(f"[stack] {part.name:<22} already up")
        elif running(s, part):
            say(f"[stack] {part.name:<22} starting (started earlier), waiting")
            _wait_healthy(s, part, None, s.logs / f"{part.name}.log")
        else:
            start_part(s, part)
            say(f"[stack] {part.name:<22} up in {time.monotonic() - t:.0f} s")
        part.ready(s)
    if not init_done(s):
        register_base(s)
        say("[stack] base model registered as version 1 in the MLflow server")
    say(f"[stack] all up in {time.monotonic() - t0:.0f} s: Airflow {s.airflow_url} (admin, password in "
        f"{s.airflow_home / 'simple_auth_manager_passwords.json.generated'}), MLflow {s.mlflow_url}, "
        f"S3 {s.s3_url}; logs in {s.logs}")


def down(s: Stack, purge: bool = False, say=print) -> None:
    """Stop every part, last first, by process group; purge: remove the stack's folder too."""
    for part in reversed(PARTS):
        pgid = running(s, part)
        if pgid:
            if part.name == "postgres":  # SIGINT is PostgreSQL's fast shutdown (SIGTERM waits for every client)
                os.killpg(pgid, signal.SIGINT)
                deadline = time.monotonic() + 20
                while group_alive(pgid) and time.monotonic() < deadline:
                    if pgid in _STARTED:
                        _STARTED[pgid].poll()
                    time.sleep(0.2)
            killed = stop_group(_STARTED.pop(pgid, pgid), 30.0)
            say(f"[stack] {part.name:<22} stopped{' (SIGKILL)' if killed else ''}")
        _pgid_file(s, part).unlink(missing_ok=True)
    if purge:
        pg = s.root / "pg"
        if pg.is_symlink():  # the cluster lives where the postgres user can reach it
            shutil.rmtree(pg.resolve(), ignore_errors=True)
        shutil.rmtree(s.root, ignore_errors=True)
        say(f"[stack] removed {s.root}")


def status(s: Stack, say=print) -> bool:
    ok = True
    for part in PARTS:
        pgid = running(s, part)
        healthy = part.healthy(s)
        ok &= healthy
        state = "healthy" if healthy else "running, not answering" if pgid else "stopped"
        say(f"{part.name:<22} {state:<24} {'pgid ' + str(pgid) if pgid else '':<12} {s.logs / (part.name + '.log')}")
    return ok


def add_stack(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["up", "down", "status", "env"],
                   help="up: start what is not running (idempotent); down: stop everything; status: health of each "
                        "part (exit 1 unless all are healthy); env: the exports that point rtrl at the stack")
    p.add_argument("--purge", action="store_true", help="with down: also remove var/stack (data, logs)")
    p.set_defaults(run=_run)


def _run(args) -> int:
    cfg: Config = load_config()
    s = Stack.from_config(cfg)
    if args.action == "env":
        for k, v in s.env().items():
            print(f"export {k}={shlex.quote(v)}")
        return 0
    if args.action == "status":
        return 0 if status(s) else 1
    if args.action == "down":
        down(s, purge=args.purge)
        return 0
    try:
        up(s)
    except StackError as exc:
        print(f"rtrl stack up: {exc}")
        return 1
    return 0
