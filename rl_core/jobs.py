"""Run one job (the trainer, `rtrl train`) with its output streamed line by line and a deadline on its whole
process group. The job is a warm fork when the environment names a warm server (rl_core/warm.py), else a
fresh process; both run in their own session, so one kill reaches every rank they started.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rl_core.warm import WarmPopen, popen


@dataclass
class Streamed:
    rc: int  # the job's exit code; 124 when the deadline stopped it
    tail: list[str]  # its last output lines, without newlines
    timed_out: bool


def run_streamed(cmd: list[str], env: dict[str, str], cwd: str | Path, on_line: Callable[[str], None],
                 timeout_s: float, *, grace_s: float = 0.0, tail_lines: int = 40,
                 on_start: Callable[[subprocess.Popen | WarmPopen], None] | None = None) -> Streamed:
    """Run cmd as a job (warm when env names a server), hand each output line to on_line as it arrives, and
    stop its whole process group: at the deadline (SIGTERM, SIGKILL grace_s later; at once with 0), when
    the caller is interrupted, and after it exits (no orphan ranks). Both trainer launchers use it: `rtrl
    train`'s and the DAG's DeepSpeedLaunchOperator. Only this thread waits on the job: a WarmPopen reads
    its exit code from a socket, which two waiting threads would split between them."""
    proc = popen(cmd, env, cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                 text=True, errors="replace", bufsize=1)
    if on_start is not None:
        on_start(proc)
    timed_out = threading.Event()
    timers: list[threading.Timer] = []

    def group(sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass

    def later(delay: float, fn: Callable[[], None]) -> None:
        t = threading.Timer(delay, fn)
        t.daemon = True
        timers.append(t)
        t.start()

    def deadline() -> None:  # a silent hang must end too: the deadline does not wait for output
        timed_out.set()
        if grace_s > 0:
            group(signal.SIGTERM)
            later(grace_s, lambda: group(signal.SIGKILL))
        else:
            group(signal.SIGKILL)

    later(timeout_s, deadline)
    tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            on_line(line)
        rc = proc.wait()
    except BaseException:  # our caller is going away (SIGTERM, Ctrl-C): take the job with us
        group(signal.SIGKILL)
        proc.wait()
        raise
    finally:
        for t in list(timers):
            t.cancel()
        group(signal.SIGKILL)  # what the job left behind
        proc.stdout.close()
    return Streamed(124 if timed_out.is_set() else rc, list(tail), timed_out.is_set())
