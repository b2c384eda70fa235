"""The trainer's side effects as callbacks (rl_core/train/callbacks.py), and its typed spec.

Fast, in-process: a fake engine records what DeepSpeed would be asked to do. The real crash and resume
(a worker exiting 17 after its checkpoint) is tests/test_train_distributed.py's slow test.
"""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from rl_core.config import TrainConfig
from rl_core.train.callbacks import (
    FAULT_ENV,
    FAULT_EXIT,
    Callback,
    Callbacks,
    Checkpointer,
    FaultInjector,
    MlflowLogger,
)
from rl_core.train.trainer import TrainSpec


class FakeEngine:
    def __init__(self, events: list, client_state: dict | None = None):
        self.events, self.client_state = events, client_state

    def save_checkpoint(self, ds_dir: str, tag: str, client_state: dict) -> None:
        self.events.append(("save", tag, client_state["step"], len(client_state["history"])))

    def load_checkpoint(self, ds_dir: str):
        return (ds_dir, self.client_state) if self.client_state else (None, None)


class Recorder(Callback):
    def __init__(self, events: list):
        self.events = events

    def on_step_end(self, step: int, metrics: dict[str, float], last: bool) -> None:
        self.events.append(("step", step))

    def on_train_end(self) -> None:
        self.events.append(("end",))


def _loop(callbacks: Callbacks, history: list, total: int, start: int = 0) -> None:
    """The trainer's loop without the training."""
    for step in range(start, total):
        rec = {"loss": 0.1, "step": step + 1}
        history.append(rec)
        callbacks.on_step_end(step + 1, rec, last=step + 1 == total)
    callbacks.on_train_end()


@pytest.mark.parametrize("every, fault_at, total, saves, exits", [
    (3, 2, 7, ["step000002", "step000003", "step000006"], [2]),  # the fault step gets its checkpoint first
    (0, 2, 4, [], [2]),  # no checkpoints: the fault still exits
    (2, 4, 4, ["step000002"], []),  # nothing after the last step: no checkpoint, no crash
    (1, 0, 3, ["step000001", "step000002"], []),
])
def test_checkpoints_then_fault_in_order(tmp_path, every, fault_at, total, saves, exits):
    events: list = []
    exited: list = []
    fault = FaultInjector(fault_at, before_exit=lambda: events.append(("bar closed",)),
                          exit_fn=lambda code: exited.append(code) or events.append(("exit", code)))
    ckpt = Checkpointer(FakeEngine(events), tmp_path / "ds", 0, every, also_at=fault.at)
    _, history = ckpt.resume()
    _loop(Callbacks([Recorder(events), ckpt, fault]), history, total)
    assert [e[1] for e in events if e[0] == "save"] == saves
    assert exited == [FAULT_EXIT] * len(exits)
    for step in exits:  # this step's checkpoint (when any) is written before the bar closes and the rank exits
        i = events.index(("step", step))
        tail = [e[0] for e in events[i + 1:events.index(("exit", FAULT_EXIT)) + 1]]
        assert tail == (["save"] if every else []) + ["bar closed", "exit"]
    assert all(e[3] == e[2] for e in events if e[0] == "save")  # the history saved covers every step done


def test_resume_continues_the_history_and_refuses_an_unreadable_checkpoint(tmp_path):
    ds = tmp_path / "ds"
    fresh = Checkpointer(FakeEngine([]), ds, 0, 1)
    assert fresh.resume() == (0, [])
    ds.mkdir()
    (ds / "latest").write_text("step000002")
    (ds / "step000001").mkdir()
    events: list = []
    ckpt = Checkpointer(FakeEngine(events, {"step": 2, "history": [{"step": 1}, {"step": 2}]}), ds, 0, 1)
    start, history = ckpt.resume()
    assert start == 2 and [h["step"] for h in history] == [1, 2]
    _loop(Callbacks([ckpt]), history, total=4, start=start)
    assert events == [("save", "step000003", 3, 3)] and not (ds / "step000001").exists()  # only the latest kept
    with pytest.raises(RuntimeError, match="cannot resume"):
        Checkpointer(FakeEngine([]), ds, 0, 1).resume()


def test_fault_step_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "5")
    assert FaultInjector.from_env().at == 5
    monkeypatch.setenv(FAULT_ENV, "")
    assert FaultInjector.from_env().at == 0


def test_mlflow_logger_logs_finite_metrics_from_rank_zero_only():
    assert MlflowLogger("file:///nowhere", "run-1", rank=1).client is None
    assert MlflowLogger("", "", rank=0).client is None
    logged: list = []

    class Client:
        def log_batch(self, run_id, metrics):
            logged.append((run_id, {m.key: (m.value, m.step) for m in metrics}))

    logger = MlflowLogger("", "run-1", rank=0)
    logger.client = Client()
    logger.on_step_end(3, {"loss": 0.5, "kl": math.nan, "step": 3}, last=False)
    assert logged == [("run-1", {"train/loss": (0.5, 3)})]


def test_spec_carries_a_typed_train_config_validated_once_on_reading():
    tc = TrainConfig(lr=3e-5, micro_batch_size=2, lora_targets=["q_proj"])
    spec = TrainSpec(run_id="r", base_dir="b", lake_root="l", out_dir="o", adapter_dir="a", ds_dir="d",
                     result_path="p", train=tc)
    assert spec.train is tc  # a validated config is kept, not re-parsed
    back = TrainSpec.model_validate_json(spec.model_dump_json())
    assert isinstance(back.train, TrainConfig) and back.train == tc
    bad = spec.model_dump(mode="json")
    bad["train"]["micro_batch_size"] = 0
    with pytest.raises(ValidationError, match="micro_batch_size"):
        TrainSpec.model_validate(bad)
    bad["train"] = tc.model_dump() | {"no_such_option": 1}
    with pytest.raises(ValidationError, match="no_such_option"):
        TrainSpec.model_validate(bad)
