"""What the trainer does beside the update, as callbacks: the training loop only trains.

After every optimizer step the loop calls `on_step_end(step, metrics, last)` on each callback, in list
order, and `on_train_end()` once after the last step. The order is behaviour, not style:
  MlflowLogger   the step's metrics to the launcher's MLflow run (rank 0; a no-op without a run id)
  ProgressBar    tqdm on rank 0's stderr
  Checkpointer   a DeepSpeed checkpoint every `checkpoint_every` steps (and at the fault step), never after
                 the last step (the HF folder is the last step's artifact); it also resumes
  FaultInjector  RTRL_TRAIN_FAULT_AFTER_STEPS=N: every rank exits with code 17 right after step N, so after
                 the Checkpointer wrote step N's checkpoint: the hook the resume test crashes a real run with
A callback that needs nothing at some point inherits the no-op from Callback.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

FAULT_ENV = "RTRL_TRAIN_FAULT_AFTER_STEPS"
FAULT_EXIT = 17


class Callback:
    """The protocol, with no-op defaults. `step` counts optimizer steps from 1; `last`: no step follows."""

    def on_step_end(self, step: int, metrics: dict[str, float], last: bool) -> None:
        """After optimizer step `step` (its token-weighted metrics over every rank, "step" included)."""

    def on_train_end(self) -> None:
        """After the last step, before the policy is gathered and saved."""


class Callbacks(Callback):
    """Several callbacks called as one, in order."""

    def __init__(self, callbacks: Sequence[Callback]):
        self.callbacks = list(callbacks)

    def on_step_end(self, step: int, metrics: dict[str, float], last: bool) -> None:
        for cb in self.callbacks:
            cb.on_step_end(step, metrics, last)

    def on_train_end(self) -> None:
        for cb in self.callbacks:
            cb.on_train_end()


class MlflowLogger(Callback):
    """Per-step metrics as train/<name> at MLflow step `step`, from rank 0; non-finite values left out."""

    def __init__(self, tracking_uri: str, run_id: str, rank: int):
        self.client, self.run_id = None, run_id
        if rank == 0 and run_id and tracking_uri:
            from mlflow import MlflowClient  # lazy: heavy (mlflow)

            self.client = MlflowClient(tracking_uri=tracking_uri)

    def on_step_end(self, step: int, metrics: dict[str, float], last: bool) -> None:
        if self.client is None:
            return
        from mlflow.entities import Metric  # lazy: heavy (mlflow)

        ts = int(time.time() * 1000)
        rows = [Metric(f"train/{k}", float(v), ts, step) for k, v in metrics.items()
                if k != "step" and math.isfinite(v)]
        self.client.log_batch(self.run_id, metrics=rows)


class ProgressBar(Callback):
    """A tqdm bar on rank 0 (stderr, so the launcher's log keeps it), starting where a resumed run starts."""

    def __init__(self, total_steps: int, start_step: int, rank: int, desc: str):
        from tqdm import tqdm  # lazy: only the worker draws it

        self.bar = tqdm(total=total_steps, initial=start_step, disable=rank != 0, file=sys.stderr, mininterval=1.0,
                        desc=desc, unit="step")

    def on_step_end(self, step: int, metrics: dict[str, float], last: bool) -> None:
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{metrics['loss']:.4f}", kl=f"{metrics['kl']:.4f}",
                             tok_s=f"{metrics['tokens_per_s']:.0f}")

    def on_train_end(self) -> None:
        self.close()

    def close(self) -> None:
        self.bar.close()


class Checkpointer(Callback):
    """DeepSpeed checkpoints in ds_dir, so that a rerun after a crash continues where it stopped.

    The client state holds the step and the metrics history; the batch plan is deterministic, so the rerun
    skips exactly the micro batches already applied. Only the latest tag is kept (rank 0 prunes).
    `history` is the list the loop appends each step's metrics to: resume() fills it from the checkpoint.
    """

    def __init__(self, engine, ds_dir: Path, rank: int, every: int, also_at: int = 0):
        self.engine, self.ds_dir, self.rank = engine, ds_dir, rank
        self.every, self.also_at = every, also_at
        self.history: list[dict] = []

    def resume(self) -> tuple[int, list[dict]]:
        """(steps already done, their history): (0, []) without a checkpoint; an unreadable one raises."""
        if not (self.ds_dir / "latest").is_file():
            return 0, self.history
        path, client = self.engine.load_checkpoint(str(self.ds_dir))
        if path is None or not client:  # unreadable: train from the parent instead of from a half state
            raise RuntimeError(f"cannot resume from {self.ds_dir}; delete it to start the update over")
        self.history[:] = list(client["history"])
        return int(client["step"]), self.history

    def on_step_end(self, step: int, metrics: dict[str, float], last: bool) -> None:
        if self.every and (step % self.every == 0 or step == self.also_at) and not last:
            self.save(step)

    def save(self, step: int) -> None:
        tag = f"step{step:06d}"
        self.engine.save_checkpoint(str(self.ds_dir), tag=tag, client_state={"step": step, "history": self.history})
        if self.rank == 0:  # keep only the latest tag
            for old in self.ds_dir.glob("step*"):
                if old.is_dir() and old.name != tag:
                    shutil.rmtree(old, ignore_errors=True)


class FaultInjector(Callback):
    """Exit with FAULT_EXIT right after step `at` (0: never; never after the last step, which has no resume).

    os._exit, not an exception: a real crash runs no cleanup either (no process-group teardown, no result).
    `before_exit` (the progress bar's close) runs first so the log's last line is whole.
    """

    def __init__(self, at: int, before_exit: Callable[[], None] | None = None,
                 exit_fn: Callable[[int], None] = os._exit):
        self.at, self.before_exit, self.exit_fn = at, before_exit, exit_fn

    @classmethod
    def from_env(cls) -> FaultInjector:
        return cls(int(os.environ.get(FAULT_ENV, "0") or 0))

    def on_step_end(self, step: int, metrics: dict[str, float], last: bool) -> None:
        if not self.at or step != self.at or last:
            return
        if self.before_exit is not None:
            self.before_exit()
        print(f"{FAULT_ENV}={self.at}: exiting after the checkpoint of step {self.at}", file=sys.stderr)
        sys.stdout.flush()
        self.exit_fn(FAULT_EXIT)
