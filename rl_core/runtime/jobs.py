"""Run one job (the trainer, `rtrl train`) with its output streamed line by line and a deadline on its whole
process group. The job is a fresh process in its own session, so one kill reaches every rank it started.

A process may install another launcher (`use_launcher`): the lab's warm fork server (lab/warm.py) installs its
own before it forks, so the DAG runs it forks start their trainers warm too. The product never imports it.
"""

from __future__ import annotations

import collections
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_core.runtime import SOCKET_ENV
from rl_core.runtime.procs import stop_group

# (cmd, env, cwd, **popen_kw) -> a Popen-like handle (pid, stdout, wait, poll); None: subprocess.Popen
Launcher = Callable[..., Any]
_launcher: Launcher | None = None


@dataclass
class Streamed:
    rc: int  # the job's exit code; 124 when the deadline stopped it
    tail: list[str]  # its last output lines, without newlines
    timed_out: bool


def use_launcher(launcher: Launcher | None) -> None:
    """Start this process's jobs (and its forks') with launcher when their env names a warm socket."""
    global _launcher
    _launcher = launcher


def _popen(cmd: list[str], env: dict[str, str], cwd: str | Path, **kw) -> Any:
    """A fresh process in its own session; the installed launcher's when there is one and env names its socket."""
    if _launcher is not None and env.get(SOCKET_ENV):
        return _launcher(cmd, env, cwd, **kw)
    return subprocess.Popen(cmd, env=env, cwd=cwd, start_new_session=True, **kw)


def run_streamed(cmd: list[str], env: dict[str, str], cwd: str | Path, on_line: Callable[[str], None],
                 timeout_s: float, *, grace_s: float = 0.0, tail_lines: int = 40,
                 on_start: Callable[[Any], None] | None = None) -> Streamed:
    """Run cmd as a job (by the installed launcher when env names its socket), hand each output line to on_line as it arrives, and
    stop its whole process group: at the deadline (SIGTERM, SIGKILL grace_s later; at once with 0), when
    the caller is interrupted, and after it exits (no orphan ranks). Both trainer launchers use it: `rtrl
    train`'s and the DAG's DeepSpeedLaunchOperator. Only this thread waits on the job: a WarmPopen reads
    its exit code from a socket, which two waiting threads would split between them, so the deadline
    timer stops the group by id and leaves the reaping to the loop below."""
    proc = _popen(cmd, env, cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                  text=True, errors="replace", bufsize=1)
    try:  # at once: a SIGTERM from here on stops the group (before it, procs.exit_on_sigterm's sweep does)
        timed_out = threading.Event()

        def deadline() -> None:  # a silent hang must end too: the deadline does not wait for output
            timed_out.set()
            stop_group(proc.pid, grace_s)

        timer = threading.Timer(timeout_s, deadline)
        timer.daemon = True
        if on_start is not None:
            on_start(proc)
        timer.start()
        tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            on_line(line)
        rc = proc.wait()
    finally:  # after the job exits (orphan ranks), or when our caller goes away (SIGTERM, Ctrl-C): kill the group
        if "timer" in locals():
            timer.cancel()
        stop_group(proc, 0)
        if proc.stdout is not None:
            proc.stdout.close()
    return Streamed(124 if timed_out.is_set() else rc, list(tail), timed_out.is_set())
