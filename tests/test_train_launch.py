"""The caller's side: bad input stops before anything is stored, the verdict fails on bad numbers,
the CLI's exit codes, and the launcher command lines."""

from __future__ import annotations

import pyarrow as pa
import pytest

from lab.testing import synthetic
from rl_core.cli import main
from rl_core.lake import lake_from_config
from rl_core.registry import store
from rl_core.reports import read_verdict
from rl_core.train.data import DataError
from rl_core.train.launch import TrainFailed, TrainSummary, build_command, check, train


def test_missing_or_bad_input_stores_nothing(cfg, tiny_checkpoint):
    lake = lake_from_config(cfg)
    with pytest.raises(DataError, match="runs/cycle-x/episodes.parquet: not found"):
        train(cfg, "cycle-x", 1)

    synthetic.make_run(lake, "cycle-bad", tiny_checkpoint, n_prompts=2, per_prompt=2)
    rewards = lake.read_parquet("runs/cycle-bad/rewards.parquet")
    bad = rewards.set_column(rewards.schema.get_field_index("reward"), "reward",
                             pa.array([1.0, float("nan"), 0.0, 1.0]))
    lake.write_parquet("runs/cycle-bad/rewards.parquet", bad)
    with pytest.raises(DataError, match="rewards.reward: not a finite number for event"):
        train(cfg, "cycle-bad", 1)
    assert not lake.exists("runs/cycle-bad/train") and not lake.exists("runs/cycle-bad/verdicts")
    assert not (cfg.models_dir / "runs" / "cycle-bad").exists()
    c = store.client(cfg)
    assert not c.search_runs([store.experiment_id(cfg)], filter_string="tags.kind = 'train'")  # no MLflow run


def test_a_hung_or_slow_update_is_killed_and_reported(registered):
    cfg = registered
    cfg.train.timeout_s = 0.5
    lake = lake_from_config(cfg)
    synthetic.make_run(lake, "cycle-slow", store.checkpoint_path(cfg, 1), n_prompts=2, per_prompt=2)
    with pytest.raises(TrainFailed, match="exit code 124"):
        train(cfg, "cycle-slow", 1)
    summary = lake.read_json("runs/cycle-slow/train/summary.json")
    assert summary["status"] == "failed" and "killed after" in summary["log_tail"]
    v = read_verdict(lake, "cycle-slow", "train")
    assert not v.passed and "exit code 124" in v.reasons[0]
    run = store.client(cfg).get_run(summary["mlflow_run_id"])
    assert run.info.status == "FAILED"


def test_cli_exit_codes(cfg, capsys):
    assert main(["train", "--run-id", "cycle-none", "--base", "1"]) == 2
    assert "runs/cycle-none/episodes.parquet: not found" in capsys.readouterr().err


def _summary(**kw) -> TrainSummary:
    base = dict(run_id="r", status="ok", exit_code=0, base_version=1, steps=3, loss=0.1, kl=0.01, kl_max=0.02)
    return TrainSummary(**(base | kw))


@pytest.mark.parametrize(
    "kw, reason",
    [
        ({"kl_max": 0.9}, "KL to the parent 0.9 exceeds gates.kl_max 0.5"),
        ({"kl_max": float("nan")}, "KL to the parent is not finite"),
        ({"loss": float("inf")}, "loss is not finite"),
        ({"steps": 0}, "no optimizer step was taken"),
        ({"status": "failed", "exit_code": 17}, "exit code 17"),
    ],
)
def test_train_verdict_fails_on_bad_numbers(cfg, kw, reason):
    assert check(cfg, _summary()).passed
    v = check(cfg, _summary(**kw))
    assert not v.passed and any(reason in r for r in v.reasons), v.reasons
    assert v.name == "train"


def test_launcher_commands(cfg, tmp_path):
    spec = tmp_path / "spec.json"
    cfg.train.launcher = "inline"
    cmd, env = build_command(cfg.train, spec, 29999)
    assert cmd[1:] == ["-m", "rl_core.train.trainer", "--spec", str(spec)]
    assert env["RANK"] == "0" and env["WORLD_SIZE"] == "1" and env["MASTER_PORT"] == "29999"
    cfg.train.launcher, cfg.train.num_procs = "torchrun", 2
    cmd, _ = build_command(cfg.train, spec, 29999)
    assert "--nproc_per_node=2" in cmd and cmd[cmd.index("-m", 2) + 1] == "rl_core.train.trainer"
    cfg.train.launcher, cfg.train.num_procs = "deepspeed", 1  # one local process: no launcher process
    cmd, env = build_command(cfg.train, spec, 29999)
    assert cmd[1:] == ["-m", "rl_core.train.trainer", "--spec", str(spec)] and env["WORLD_SIZE"] == "1"
    cfg.train.num_procs, cfg.train.hostfile = 2, "/etc/rtrl/hostfile"
    cmd, _ = build_command(cfg.train, spec, 29999)
    assert cmd[1:3] == ["-m", "deepspeed.launcher.runner"]
    assert "--hostfile=/etc/rtrl/hostfile" in cmd and "--num_gpus=2" in cmd and "--module" in cmd


def test_summary_round_trips_through_json():
    s = _summary(tokens_per_s=12.5, entropy=float("nan"))
    assert s.entropy is None  # JSON has no NaN: unknown is None, and a failed summary still reloads
    assert TrainSummary.model_validate_json(s.model_dump_json()) == s


def test_stale_jit_build_lock_is_cleared_fresh_one_kept(tmp_path):
    """A compile killed mid-way leaves `lock`; torch would then wait forever in every later training."""
    import os
    import time

    from rl_core.train.launch import clear_stale_build_locks

    stale, fresh = tmp_path / "deepspeed_shm_comm" / "lock", tmp_path / "other_op" / "lock"
    for p in (stale, fresh):
        p.parent.mkdir()
        p.touch()
    old = time.time() - 3600
    os.utime(stale, (old, old))
    assert clear_stale_build_locks(tmp_path) == [stale]
    assert not stale.exists() and fresh.exists()
    assert clear_stale_build_locks(tmp_path / "missing") == []


@pytest.mark.timeout(300)
def test_sigterm_to_rtrl_train_stops_its_trainer(registered, own_processes):
    """Airflow's on_kill (or any scheduler) sends SIGTERM to `rtrl train`; the trainer it launched runs in
    its own session and must stop too, not keep the CPUs (or GPUs) busy with nobody waiting."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    cfg = registered
    synthetic.make_run(lake_from_config(cfg), "cycle-term", store.checkpoint_path(cfg, 1), n_prompts=64,
                       per_prompt=4)
    repo = Path(__file__).resolve().parent.parent

    def trainer_running() -> bool:
        for pid in own_processes():
            try:
                if b"rl_core.train.trainer" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return True
            except OSError:  # it ended between the listing and the read
                pass
        return False

    proc = subprocess.Popen([sys.executable, "-m", "rl_core.cli", "train", "--run-id", "cycle-term", "--base", "1"],
                            cwd=repo, env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not trainer_running():
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the trainer never started"
            time.sleep(0.02)  # SIGTERM as soon as the trainer shows: the moment `rtrl train` may not yet know it
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
        assert proc.returncode == 143
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    time.sleep(0.5)  # SIGKILL of the group is asynchronous
    assert not own_processes(), "the trainer outlived `rtrl train`"


@pytest.mark.timeout(120)
def test_sigterm_before_a_child_is_registered_still_stops_it(own_processes, tmp_path):
    """Issue 44 item 8: a SIGTERM that lands after a job's child exists but before the `try` whose `finally`
    stops it (inside subprocess.Popen, or while the deadline timer's thread starts) left the trainer running,
    reparented to init, in its own session: `make test` saw it under load as "the trainer outlived `rtrl
    train`". exit_on_sigterm must stop every session child its block started, wherever the signal landed."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    script = tmp_path / "unregistered.py"
    script.write_text(
        "import os, signal, subprocess, sys, time\n"
        "from rl_core.runtime.procs import exit_on_sigterm\n"
        "with exit_on_sigterm():\n"
        "    child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
        "    print(child.pid, flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)  # no try/finally knows the child yet\n"
        "    time.sleep(60)\n")
    repo = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, str(script)], cwd=repo, env=dict(os.environ, PYTHONPATH=str(repo)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    out, err = proc.communicate(timeout=60)
    child = int(out.split()[0])
    try:
        assert proc.returncode == 143, err
        assert not own_processes(), f"the child outlived its parent's SIGTERM:\n{err}"
        assert f"stopping process groups [{child}]" in err
    finally:
        if own_processes():
            os.killpg(child, signal.SIGKILL)
            time.sleep(0.2)
