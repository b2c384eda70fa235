"""DeepSpeedLaunchOperator: run the trainer as its own processes and stream their log into the task log.

Training must not run inside the Airflow worker: it needs its own process group (the DeepSpeed launcher
forks one process per GPU/CPU rank, possibly over a hostfile of GPU nodes), far more memory than a
worker, and a clean kill when the task is cleared or times out. So this operator starts `rtrl train`
(which calls rl_core.train.launch.train, and that the `deepspeed` launcher) in a new session, copies
every line it prints into the task log as it arrives, kills the whole process group on timeout or
on_kill, and then reads what the trainer left in the lake: the `train` verdict (finite loss, KL within
bounds). A failing verdict fails the task without retry; a crash (non-zero exit) is retried.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from rl_core.config import load_config
from rl_core.lake import Lake
from rl_core.reports import read_verdict


def train_command(run_id: str, base_version: int | str) -> list[str]:
    """The default command: the `rtrl train` CLI of this interpreter's environment."""
    return [sys.executable, "-m", "rl_core.cli", "train", "--run-id", str(run_id), "--base", str(base_version)]


class DeepSpeedLaunchOperator(BaseOperator):
    """Launch a training command in its own process group, stream its output, then check its verdict.

    :param rtrl_run_id: the cycle's run id (templated).
    :param base_version: the registry version to update (templated; an XComArg works).
    :param command: the argv to run (templated); default `rtrl train --run-id .. --base-version ..`.
    :param env: extra environment variables for the trainer (templated), e.g. NCCL or hostfile settings.
    :param timeout_s: kill the process group after this long; default cfg.train.timeout_s.
    :param check_verdict: read runs/<run_id>/verdicts/<verdict_name>.json afterwards and fail on it.
    """

    template_fields: Sequence[str] = ("rtrl_run_id", "base_version", "command", "env")
    ui_color = "#aed6f1"

    def __init__(
        self,
        *,
        rtrl_run_id: Any,
        base_version: Any,
        command: list[str] | None = None,
        env: dict[str, str] | None = None,
        timeout_s: float | None = None,
        check_verdict: bool = True,
        verdict_name: str = "train",
        no_retry_exit_codes: Sequence[int] = (2,),
        tail_lines: int = 40,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.rtrl_run_id = rtrl_run_id
        self.base_version = base_version
        self.command = command
        self.env = env or {}
        self.timeout_s = timeout_s
        self.check_verdict = check_verdict
        self.verdict_name = verdict_name
        self.no_retry_exit_codes = tuple(no_retry_exit_codes)
        self.tail_lines = tail_lines
        self._proc: subprocess.Popen | None = None

    # --- process handling ---------------------------------------------------------------------------
    def _kill_group(self, reason: str) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        self.log.warning("stopping trainer process group %d: %s", proc.pid, reason)
        from rl_core.runtime.procs import stop_group  # lazy: keeps DAG parsing light

        stop_group(proc, 15.0)

    def run_streaming(self, argv: list[str], timeout_s: float) -> int:
        """Run argv in a new session; every output line goes to the task log. Returns the exit code."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **{k: str(v) for k, v in self.env.items()}}
        self.log.info("launching: %s", " ".join(argv))
        from rl_core.runtime import jobs  # lazy: keeps DAG parsing light

        def on_start(proc) -> None:
            self._proc = proc  # for on_kill

        res = jobs.run_streamed(argv, env, os.getcwd(), lambda line: self.log.info("[trainer] %s", line.rstrip("\n")),
                                timeout_s, grace_s=15.0, tail_lines=self.tail_lines, on_start=on_start)
        self._tail = collections.deque(res.tail, maxlen=self.tail_lines)
        if res.timed_out:
            raise AirflowException(f"trainer timed out after {timeout_s:.0f}s and was killed")
        return res.rc

    def on_kill(self) -> None:
        self._kill_group("task killed")

    # --- the task ---------------------------------------------------------------------------------
    def execute(self, context: Any) -> dict[str, Any]:
        cfg = load_config()
        run_id = str(self.rtrl_run_id)
        argv = [str(a) for a in (self.command or train_command(run_id, self.base_version))]
        rc = self.run_streaming(argv, float(self.timeout_s or cfg.train.timeout_s))
        verdict = read_verdict(Lake(cfg.lake_root), run_id, self.verdict_name) if self.check_verdict else None
        if verdict is not None and not verdict.passed:  # a refused checkpoint: retrying cannot help
            raise AirflowFailException(f"{verdict.name} refused the checkpoint:\n  - " + "\n  - ".join(verdict.reasons))
        if rc != 0:
            tail = "\n".join(self._tail)
            exc = AirflowFailException if rc in self.no_retry_exit_codes else AirflowException  # bad input: no retry
            raise exc(f"trainer exited with code {rc}; last lines:\n{tail}")
        out: dict[str, Any] = {
            "run_id": run_id,
            "base_version": self.base_version,
            "checkpoint": str(cfg.models_dir / "runs" / run_id / "checkpoint"),
        }
        if not self.check_verdict:
            return out
        if verdict is None:
            raise AirflowFailException(f"trainer exited 0 but wrote no '{self.verdict_name}' verdict for {run_id}")
        self.log.info("verdict %s: %s %s", verdict.name, verdict.passed, verdict.details)
        out["details"] = {k: v for k, v in verdict.details.items() if isinstance(v, (int, float, str, bool))}
        return out
