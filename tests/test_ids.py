"""One rule for identifiers and a bounded window (issue 44, item 7), at every entry: the lake's run folders,
the `rtrl` command's arguments, MLflow filters, the org adapters and the DAGs' params."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

import pytest

from rl_core.cli import main
from rl_core.ids import IdError, check_org_id, check_run_id, mlflow_filter_value

BAD_RUN_IDS = ["a'b", "a\nb", "a\\b", 'a"b', "r" * 300, "../x", "a b", ".hidden", ""]


def test_the_lake_takes_plain_run_ids_only():
    from rl_core.lake import Lake

    for run_id in ("cycle-20261206T1400", "cycle-20261206T1400-20261206T1930.org-acme", "eval-v3", "r" * 128):
        assert Lake.run(run_id).root == f"runs/{run_id}"
    for run_id in BAD_RUN_IDS:
        with pytest.raises(IdError, match="run_id"):
            Lake.run(run_id)
        with pytest.raises(IdError):
            check_run_id(run_id)
    assert check_org_id("org-acme_2") == "org-acme_2"
    with pytest.raises(IdError, match="org_id"):
        check_org_id("org.acme")  # '.' separates <run_id>.<org_id>


COMMANDS = [
    ["train", "--base", "1"],
    ["rewards"],
    ["gate", "episodes"],
    ["register"],
    ["deploy", "--version", "1"],
    ["harvest", "--start", "2026-12-02T05:00:00+00:00", "--end", "2026-12-02T10:00:00+00:00", "--policy-version", "1"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("run_id", ["a' AND tags.kind = 'train", "a\nb", "a\\b", "r" * 300])
def test_a_bad_run_id_argument_is_one_line_naming_it(cfg, capsys, command, run_id):
    rc = main([*command, "--run-id", run_id])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith(f"rtrl {command[0]}: --run-id: ") and err.count("\n") == 1, err
    assert "Traceback" not in err


def test_a_bad_org_argument_is_refused(cfg, capsys):
    rc = main(["harvest", "--start", "2026-12-02T05:00:00+00:00", "--end", "2026-12-02T10:00:00+00:00",
               "--policy-version", "1", "--run-id", "run-x", "--org", "org' OR 1=1"])
    assert rc == 2 and capsys.readouterr().err.startswith("rtrl harvest: --org: ")


def test_mlflow_filters_take_no_injected_clause(registered):
    """`a' AND tags.kind = 'train` once ended launch's filter literal and added a clause: the trainer's MLflow
    run of another run id was found and continued. Every filter value goes through mlflow_filter_value."""
    from rl_core.registry import store
    from rl_core.registry.register import RegisterError, find_version, register_run
    from rl_core.train.launch import _mlflow_run

    real = _mlflow_run(registered, "cycle-real", {})
    assert _mlflow_run(registered, "cycle-real", {}) == real  # a retry continues its own run
    for hostile in ("cycle-real' AND tags.kind = 'train", "x\\' OR '1'='1", "x\nb"):
        with pytest.raises(IdError):
            _mlflow_run(registered, hostile, {})
        with pytest.raises(IdError):
            find_version(registered, hostile)
        with pytest.raises(RegisterError, match="run_id"):
            register_run(registered, hostile)
        with pytest.raises(IdError, match="quote|backslash|control"):
            mlflow_filter_value(hostile)
    runs = store.client(registered).search_runs([store.experiment_id(registered)],
                                                filter_string=f"tags.kind = {mlflow_filter_value('train')}")
    assert [r.info.run_id for r in runs] == [real], "no run was created or reused for a hostile id"


def test_org_ids_follow_the_one_rule_and_stay_org_errors(cfg):
    from rl_core.orgs.pipeline import OrgError, check_org

    assert check_org(cfg, "org-acme") == "org-acme"
    for bad in ("o" * 65, "org.acme", "org\n", "../org", ""):
        with pytest.raises(OrgError, match="org_id"):
            check_org(cfg, bad)


# --- the window's length ----------------------------------------------------------------------------

def test_a_window_longer_than_max_window_hours_is_refused():
    from rl_core.window import MAX_WINDOW_HOURS, WindowError, resolve_window

    assert MAX_WINDOW_HOURS == 168
    week = {"start": "2026-11-25T10:00:00+00:00", "end": "2026-12-02T10:00:00+00:00"}
    assert resolve_window(week, None, None, 5).end - resolve_window(week, None, None, 5).start == timedelta(days=7)
    century = {"start": "1926-12-02T10:00:00+00:00", "end": "2026-12-02T10:00:00+00:00"}
    with pytest.raises(WindowError, match="876600 hours; at most 168 allowed .harvest.max_window_hours"):
        resolve_window(century, None, None, 5)
    with pytest.raises(WindowError, match="at most 6 allowed"):
        resolve_window({"start": "2026-12-02T00:00:00Z", "end": "2026-12-02T07:00:00Z"}, None, None, 5, max_hours=6)
    with pytest.raises(ValueError, match="out of range"):
        resolve_window({"start": "0001-01-01T00:00:00+01:00", "end": "2026-12-02T07:00:00Z"}, None, None, 5)


def test_the_cli_refuses_a_long_window_before_walking_it(cfg, capsys, monkeypatch):
    start = datetime(2026, 11, 1, tzinfo=UTC)
    args = ["harvest", "--policy-version", "1", "--run-id", "run-long", "--start", start.isoformat()]
    assert main([*args, "--end", (start + timedelta(hours=169)).isoformat()]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rtrl harvest: window [") and "harvest.max_window_hours" in err, err
    monkeypatch.setenv("RTRL_HARVEST__MAX_WINDOW_HOURS", "10")
    assert main(["gate", "raw", "--run-id", "run-long", "--start", start.isoformat(),
                 "--end", (start + timedelta(hours=11)).isoformat()]) == 2
    assert "at most 10 allowed" in capsys.readouterr().err


def test_config_has_the_window_bound(cfg):
    assert cfg.harvest.max_window_hours == 168


def test_dag_params_refuse_bad_windows_at_trigger_time():
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk.exceptions import ParamValidationError

    from tests.test_dag_import import REPO

    bag = DagBag(dag_folder=str(REPO / "dags"))
    for dag_id in ("realtime_rl", "realtime_rl_orgs"):
        params = bag.dags[dag_id].params
        good = copy.deepcopy(params)
        good["start"], good["end"] = "2026-12-02T05:00:00+00:00", "2026-12-02T10:00:00Z"
        assert good.validate()["start"] == "2026-12-02T05:00:00+00:00"
        for key, bad in [("start", "0001-01-01T00:00:00+00:00"), ("end", "9999-12-31T23:00:00+00:00"),
                         ("start", "2026-12-02T05:00:00"), ("end", "2026-12-02T10:00:00+00:00" + " " * 40),
                         ("start", "2026-12-02T05:00:00+00:00\n"), ("policy_version", 2**40)]:
            broken = copy.deepcopy(params)
            with pytest.raises(ParamValidationError, match=key):
                broken[key] = bad
                broken.validate()
