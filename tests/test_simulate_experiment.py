"""`rtrl experiment --cycles 2` on the tiny profile: two real cycles (gateway subprocess, simulated users,
`airflow dags test`), curves read back from the lake, logged to MLflow with a PNG."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.simulate.experiment import CURVES, Paired, paired


def test_paired_interval_is_a_paired_t_interval():
    first = {f"u{i}": 0.1 * i for i in range(10)}
    last = {u: v + 0.5 + (0.05 if i % 2 else -0.05) for i, (u, v) in enumerate(first.items())}
    p = paired(first, last | {"only-last": 9.0})
    assert isinstance(p, Paired) and p.n_users == 10
    assert p.diff == pytest.approx(0.5) and p.excludes_zero and p.ci_low < 0.5 < p.ci_high
    noisy = paired(first, {u: v + (1 if i % 2 else -1) for i, (u, v) in enumerate(first.items())})
    assert noisy is not None and not noisy.excludes_zero
    assert paired({"a": 1.0}, {"a": 2.0}) is None


@pytest.mark.slow
@pytest.mark.very_slow  # two whole cycles (3.4 min on the idle machine, more loaded): `make test-all`
@pytest.mark.timeout(1800)  # two real cycles: ~7 min each on the loaded 2-core machine (fixed costs dominate)
def test_experiment_two_cycles_logs_learning_curves(rtrl_home, tmp_path, monkeypatch):
    from rl_core.cli import main
    from rl_core.config import load_config
    from rl_core.registry import store

    monkeypatch.setenv("RTRL_EVAL__TASK_LIMIT", "4")
    out = tmp_path / "exp"
    rc = main(["experiment", "--cycles", "2", "--interactions", "24", "--users", "6", "--out", str(out)])
    cfg = load_config()
    import json

    curves = json.loads((out / "curves.json").read_text())
    assert rc == 0, [c["dag_rc"] for c in curves]
    assert [c["cycle"] for c in curves] == [1, 2]
    for c in curves:
        assert c["episodes"] > 0 and c["mean_reward"] is not None and c["user_reward"]
    assert (out / "learning_curves.png").read_bytes()[:4] == b"\x89PNG"
    assert "paired by user" in (out / "results.md").read_text()
    # cycle 1's deployed challenger serves part of cycle 2's traffic (deploy -> A/B)
    first_new = curves[0]["new_version"]
    if curves[0]["aliases"].get("challenger") == first_new:
        assert str(first_new) in curves[1]["served"]
    c = store.client(cfg)
    exp = c.get_experiment_by_name(f"{cfg.mlflow.experiment}-learning")
    runs = c.search_runs([exp.experiment_id])
    assert len(runs) == 1
    hist = c.get_metric_history(runs[0].info.run_id, "mean_reward")
    assert [m.step for m in hist] == [1, 2]
    assert set(runs[0].data.metrics) >= {"mean_reward", "edit_persisted_rate", "broken_tool_rate"}
    assert set(CURVES) >= {"kl", "eval_pass_rate", "clarifying_rate"}


def test_train_base_is_the_champion_or_the_deployed_challenger(registered):
    from lab.simulate.experiment import train_base
    from rl_core.registry import store

    cfg = registered
    assert train_base(cfg, "champion") is None  # the DAG's default: its champion
    assert train_base(cfg, "latest") == 1  # no challenger yet: the champion
    v = store.register_checkpoint(cfg, store.checkpoint_path(cfg, 1), run_name="t")
    store.set_alias(cfg, "challenger", int(v), "test")
    assert train_base(cfg, "latest") == int(v)


def test_curves_plot_and_table_show_every_curve_including_a_failed_cycle(cfg, tmp_path):
    from lab.simulate.experiment import CycleMetrics, markdown, plot

    ok = CycleMetrics(1, "cycle-a", 0, 96, 96, -1.2, 0.04, 0.0, 0.0, 0.0, 0.016, 2, {"champion": 1, "challenger": 2},
                      {"1": 96}, no_edit_rate=0.31)
    failed = CycleMetrics(2, "cycle-b", 1, 96, 96, -1.1, 0.01, None, 0.01, 0.0, None, None, {"champion": 1},
                          {"2": 96}, no_edit_rate=0.55)
    png = plot([ok, failed], tmp_path / "curves.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    md = markdown([ok, failed], None, cfg, 60.0)
    header, _, first, second = md.splitlines()[2:6]
    assert "no edit" in header and header.count("|") == first.count("|") == second.count("|")
    assert "| 0.310 |" in first and "| rc 1 |" in second and "| 0.550 |" in second and "| n/a |" in second


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigterm_stops_the_experiment_and_every_process_it_started(own_processes, tmp_path):
    """A scheduler's or `timeout`'s SIGTERM must not leave the gateway, its engines or the warm server behind:
    they run in their own sessions, so only the experiment's own unwinding can stop them."""
    import os
    import re
    import signal
    import socket
    import subprocess
    import sys
    import time

    repo = Path(__file__).resolve().parent.parent

    proc = subprocess.Popen([sys.executable, "-m", "rl_core.cli", "experiment", "--cycles", "1",
                             "--out", str(tmp_path / "exp")], cwd=repo, env=dict(os.environ),
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    port = None
    try:
        deadline = time.monotonic() + 420
        for line in proc.stderr:
            if m := re.search(r"\[experiment\] cycle 1/1 \(gateway http://[\d.]+:(\d+)\)", line):
                port = int(m.group(1))
                break
            assert time.monotonic() < deadline, "the experiment never started its first cycle"
        assert port, "the experiment exited before its first cycle"
        assert len(own_processes()) >= 3  # the experiment, its gateway and its warm server at least
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)  # drains stderr while it unwinds
        assert proc.returncode == 143, err[-4000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    with pytest.raises(OSError):  # nobody listens on the gateway's port any more
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert not own_processes(), "processes of the experiment outlived it"
