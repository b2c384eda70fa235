"""The Airflow operators in plugins/, run for real: real subprocesses, a real lake, real verdict files."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

# what Airflow does for $AIRFLOW_HOME/plugins: the plugins folder is importable
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "plugins"))


def _verdict(cfg, run_id: str, name: str, passed: bool, reasons=()):
    from rl_core.lake import Lake
    from rl_core.reports import Verdict, write_verdict

    write_verdict(Lake(cfg.lake_root), run_id, Verdict(name=name, passed=passed, reasons=list(reasons)))


# --- DeepSpeedLaunchOperator ------------------------------------------------------------------------

def _script(body: str) -> list[str]:
    return [sys.executable, "-c", body]


def test_launcher_streams_the_log_and_passes_on_a_good_verdict(cfg, capsys):
    from rtrl_operators import DeepSpeedLaunchOperator

    # the "trainer" is a real process that logs and writes its verdict into the lake, as rtrl train does
    body = (
        "from rl_core.config import load_config; from rl_core.lake import Lake;"
        "from rl_core.reports import Verdict, write_verdict;"
        "print('step 1 loss 0.5'); print('step 2 loss 0.4');"
        "write_verdict(Lake(load_config().lake_root), 'cycle-x', Verdict(name='train', passed=True, details={'kl': 0.01}))"
    )
    op = DeepSpeedLaunchOperator(task_id="t", rtrl_run_id="cycle-x", base_version=1, command=_script(body))
    out = op.execute({})
    assert out["details"] == {"kl": 0.01}
    assert out["checkpoint"].endswith("runs/cycle-x/checkpoint")
    assert "[trainer] step 2 loss 0.4" in capsys.readouterr().out  # Airflow's task log (structlog -> stdout)


def test_launcher_fails_without_retry_on_a_failing_verdict(cfg):
    from airflow.sdk.exceptions import AirflowFailException
    from rtrl_operators import DeepSpeedLaunchOperator

    _verdict(cfg, "cycle-y", "train", False, ["KL 0.9 > kl_max 0.5"])
    for code in (0, 1):  # `rtrl train` exits 1 on GateFailed
        op = DeepSpeedLaunchOperator(task_id="t", rtrl_run_id="cycle-y", base_version=1,
                                     command=_script(f"import sys; sys.exit({code})"))
        with pytest.raises(AirflowFailException, match="KL 0.9"):
            op.execute({})


def test_launcher_bad_input_exit_code_is_not_retried(cfg):
    from airflow.sdk.exceptions import AirflowFailException
    from rtrl_operators import DeepSpeedLaunchOperator

    op = DeepSpeedLaunchOperator(task_id="t", rtrl_run_id="cycle-d", base_version=1,
                                 command=_script("import sys; print('no episodes'); sys.exit(2)"))
    with pytest.raises(AirflowFailException, match="code 2"):
        op.execute({})


def test_launcher_reports_a_crash_with_the_last_lines(cfg):
    from airflow.sdk.exceptions import AirflowException, AirflowFailException
    from rtrl_operators import DeepSpeedLaunchOperator

    op = DeepSpeedLaunchOperator(task_id="t", rtrl_run_id="cycle-z", base_version=1,
                                 command=_script("import sys; print('loading'); sys.exit('CUDA out of memory')"))
    with pytest.raises(AirflowException, match="code 1") as err:
        op.execute({})
    assert "CUDA out of memory" in str(err.value)
    assert not isinstance(err.value, AirflowFailException)  # a crash may be retried


def test_launcher_without_verdict_fails(cfg):
    from airflow.sdk.exceptions import AirflowFailException
    from rtrl_operators import DeepSpeedLaunchOperator

    op = DeepSpeedLaunchOperator(task_id="t", rtrl_run_id="cycle-w", base_version=1, command=_script("pass"))
    with pytest.raises(AirflowFailException, match="no 'train' verdict"):
        op.execute({})


def test_launcher_timeout_kills_the_whole_process_group(cfg, tmp_path):
    from airflow.sdk.exceptions import AirflowException
    from rtrl_operators import DeepSpeedLaunchOperator

    pidfile = tmp_path / "child.pid"
    # a "rank" child that would outlive its parent if only the parent were killed
    body = (
        "import subprocess, sys, time;"
        f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']);"
        f"open({str(pidfile)!r}, 'w').write(str(c.pid)); print('started', flush=True); time.sleep(120)"
    )
    op = DeepSpeedLaunchOperator(task_id="t", rtrl_run_id="cycle-t", base_version=1, command=_script(body),
                                 timeout_s=3)
    t0 = time.time()
    with pytest.raises(AirflowException, match="timed out"):
        op.execute({})
    assert time.time() - t0 < 30
    child = int(pidfile.read_text())
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"child rank {child} survived the timeout")


def test_default_command_is_rtrl_train():
    from rtrl_operators.deepspeed_launch import train_command

    argv = train_command("cycle-1", 3)
    assert argv[1:] == ["-m", "rl_core.cli", "train", "--run-id", "cycle-1", "--base", "3"]


# --- DataQualityGateOperator ------------------------------------------------------------------------

def rows_at_least_three(cfg, run_id, start):
    """A custom check for the operator: passes when the window's name is long enough (any DAG's check)."""
    from rl_core.reports import GateFailed, Verdict

    n = len(run_id)
    v = Verdict(name="custom", passed=n >= 3, reasons=[] if n >= 3 else [f"run_id has {n} chars < 3"],
                details={"start": start.isoformat(), "expectations": [{"type": "len", "unexpected_count": 3 - n}]})
    if not v.passed:
        raise GateFailed(v)
    return v


def test_gate_operator_passes_and_fails_with_the_report(capsys):
    from airflow.sdk.exceptions import AirflowFailException
    from rtrl_operators import DataQualityGateOperator

    kw = {"check": "custom", "callable_path": "test_dag_plugins:rows_at_least_three", "arg_names": ["run_id", "start"]}
    ok = DataQualityGateOperator(task_id="ok", window={"run_id": "cycle-1", "start": "2026-12-02T10:00:00+00:00"}, **kw)
    assert ok.execute({}) == {"name": "custom", "passed": True, "reasons": []}
    assert ok.retries == 0
    bad = DataQualityGateOperator(task_id="bad", window={"run_id": "c", "start": "2026-12-02T10:00:00+00:00"}, **kw)
    with pytest.raises(AirflowFailException, match="run_id has 1 chars < 3"):
        bad.execute({})
    assert '"unexpected_count": 2' in capsys.readouterr().out  # the full report is in the task log


def test_gate_operator_rejects_unknown_checks_and_missing_args():
    from airflow.sdk.exceptions import AirflowFailException
    from rtrl_operators import DataQualityGateOperator

    with pytest.raises(ValueError, match="unknown"):
        DataQualityGateOperator(task_id="x", check="nope", window={})
    op = DataQualityGateOperator(task_id="y", check="gate_raw", window={"run_id": "cycle-1"})
    with pytest.raises(AirflowFailException, match=r"missing argument\(s\) \['start', 'end'\]"):
        op.execute({})


def test_no_plugin_file_shadows_a_real_package():
    """Airflow imports each plugins/**/*.py as a top-level module named after the file: a plugin file called
    deepspeed.py once replaced the real deepspeed package in the test process (and would in every worker)."""
    from importlib.machinery import PathFinder

    plugins = Path(__file__).resolve().parent.parent / "plugins"
    outside = [p for p in sys.path if p and not Path(p).resolve().is_relative_to(plugins)]
    stems = [f.stem for f in plugins.rglob("*.py") if f.stem != "__init__"]
    assert stems and PathFinder.find_spec("deepspeed", outside) is not None  # the check sees real packages
    for stem in stems:
        found = PathFinder.find_spec(stem, outside)  # ignores sys.modules: what a fresh worker would import
        assert found is None, f"plugins/**/{stem}.py shadows the installed module {stem} ({found.origin})"
