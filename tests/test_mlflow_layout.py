"""MLflow laid out for the decision (rl_core/registry/layout.py), on real MLflow over SQLite: classic ML
experiments with the deciding columns as a shared view, `_decide/*` first in every sorted metric list, the same
root files in every run of a kind (MLflow's compare view shows only those), the table as the run's description,
A/B decisions with their counts and reason, short version rows, one run-name format that the docs state, and the
embedded UI started without MLflow's job queue."""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from test_registry_lifecycle import write_run

from rl_core.lake import Lake
from rl_core.registry import card, layout, store
from rl_core.registry.deploy import deploy
from rl_core.registry.register import register_run
from rl_core.reports import Verdict, read_verdict, write_verdict

REPO = Path(__file__).resolve().parent.parent
START = datetime(2026, 12, 2, 5, tzinfo=UTC)
END = START + timedelta(hours=5)


def ab_window(cfg, champion: int, challenger: int):
    """A real A/B analysis of a window with traffic on both arms (lab/testing/ab_synth.py)."""
    from lab.testing import ab_synth
    from lab.testing.ab_synth import ArmSpec
    from rl_core.ab.verdict import ab_verdict

    events, feedback = ab_synth.synth_ab(80, 30, START, END, ArmSpec(champion), ArmSpec(challenger), seed=4)
    lake = Lake(cfg.lake_root)
    ab_synth.write_to_lake(lake, "interactions", events)
    ab_synth.write_to_lake(lake, "feedback", feedback)
    return ab_verdict(cfg, START, END)


@pytest.fixture
def lifecycle(registered, tiny_checkpoint):
    """v2 registered, deployed and A/B-tested against v1; v3 registered without an eval verdict."""
    cfg = registered
    write_run(cfg, "cycle-a", tiny_checkpoint, parent=1)
    lake = Lake(cfg.lake_root)  # the paired difference evals/compare.py reports (its keys), beside write_run's aggregates
    details = {**read_verdict(lake, "cycle-a", "eval").details, "diff_passed": 0.05, "se_passed": 0.02,
               "mde_passed": 0.056}
    write_verdict(lake, "cycle-a", Verdict(name="eval", passed=True, details=details))
    v2 = register_run(cfg, "cycle-a")
    assert deploy(cfg, "cycle-a", v2)
    rates = {"n": 40, "broken_tool_rate": 0.1, "clarify_rate": 0.05, "empty_refusal_rate": 0.0, "no_edit_rate": 0.2}
    card.log_monitors(cfg, Verdict(name="monitors", passed=True, details={
        "run_id": "cycle-x", "compared": [v2], "rates": {str(v2): rates}, "reference": {**rates, "clarify_rate": 0.04},
        "tripped": []}))
    result = ab_window(cfg, 1, v2)
    write_run(cfg, "cycle-b", tiny_checkpoint, parent=1, missing="eval")
    v3 = register_run(cfg, "cycle-b")
    return cfg, v2, v3, result


def test_experiments_are_classic_ml_with_the_deciding_columns_as_shared_view(lifecycle):
    cfg, v2, _, result = lifecycle
    c = store.client(cfg)
    for purpose, exp_id in (("train", store.experiment_id(cfg)), ("ab", store.experiment_id(cfg, "ab"))):
        tags = c.get_experiment(exp_id).tags
        assert tags["mlflow.experimentKind"] == "custom_model_development"
        view = json.loads(tags[layout.SHARED_VIEW_TAG])
        assert view["selectedColumns"] == layout.COLUMNS[purpose]
    # every metric column of the view names a metric the runs have (a typo would show an empty column)
    runs = {"train": c.get_run(store.get_version(cfg, v2).run_id), "ab": c.get_run(result.mlflow_run_id)}
    for purpose, run in runs.items():
        wanted = {col[len("metrics.`"):-1] for col in layout.COLUMNS[purpose] if col.startswith("metrics.")}
        assert wanted <= set(run.data.metrics), sorted(wanted - set(run.data.metrics))
    url = layout.runs_url("http://h:5000", "7")
    assert url == "http://h:5000/#/experiments/7/runs?workflowType=machine_learning&viewStateShareKey=decide"


def test_an_older_experiment_gets_the_layout_when_next_used(cfg):
    c = store.client(cfg)
    old = c.create_experiment(cfg.mlflow.experiment + "-ab")  # as an earlier rtrl made it: GenAI by default
    assert store.experiment_id(cfg, "ab") == old
    assert c.get_experiment(old).tags["mlflow.experimentKind"] == "custom_model_development"


def test_the_deciding_numbers_sort_first_and_match_their_sources(lifecycle):
    cfg, v2, _, result = lifecycle
    m = store.client(cfg).get_run(store.get_version(cfg, v2).run_id).data.metrics
    ordered = sorted(m)  # MLflow's compare view: Array.prototype.sort, code-unit order, as Python's
    n = len([k for k in m if k.startswith(layout.DECIDE)])
    assert n == len(layout.VERSION_DECIDE) and all(k.startswith(layout.DECIDE) for k in ordered[:n]), ordered[:n + 2]
    d = {k.removeprefix(layout.DECIDE): v for k, v in m.items() if k.startswith(layout.DECIDE)}
    assert d["1_reward_mean"] == m["reward/mean"] and d["2_kl_max"] == m["train/kl_max"]
    assert d["3_eval_delta"] == pytest.approx(0.05)
    assert (d["3_eval_delta_lo"], d["3_eval_delta_hi"]) == pytest.approx((0.05 - 1.96 * 0.02, 0.05 + 1.96 * 0.02))
    assert d["3_eval_mde"] == pytest.approx(0.056)  # the detectable change the eval report states
    assert d["4_monitor_clarify_rate"] == 0.05
    assert (d["5_ab_n_champion"], d["5_ab_n_challenger"]) == (result.n["champion"], result.n["challenger"])
    assert d["5_ab_primary_p"] == m[f"ab/{cfg.ab.primary}_p_value"]
    ab = store.client(cfg).get_run(result.mlflow_run_id).data.metrics
    assert sorted(ab)[0].startswith(layout.DECIDE) and ab["_decide/n_challenger"] == result.n["challenger"]


def test_every_run_of_a_kind_has_the_same_root_files_and_a_description(lifecycle):
    cfg, v2, v3, result = lifecycle
    c = store.client(cfg)

    def root_files(run_id: str) -> set[str]:
        return {a.path for a in c.list_artifacts(run_id) if not a.is_dir}

    r2, r3 = (store.get_version(cfg, v).run_id for v in (v2, v3))
    assert root_files(r2) == root_files(r3) == set(layout.COMMON_FILES["train"])  # v3 has no eval: placeholders
    assert "no eval report" in Path(c.download_artifacts(r3, "eval_report.md", str(cfg.home_path))).read_text()
    assert set(layout.COMMON_FILES["ab"]) <= root_files(result.mlflow_run_id)
    verdicts = json.loads(Path(c.download_artifacts(r2, "verdicts.json", str(cfg.home_path))).read_text())
    assert verdicts["eval"]["passed"] is True and set(verdicts) >= {"train", "gate_raw"}

    note = c.get_run(r2).data.tags[card.NOTE]
    assert f"{cfg.mlflow.model_name} version {v2}" in note and "| parent | v1 |" in note and "**History**" in note
    assert "paired interval of all" in note
    ab_note = c.get_run(result.mlflow_run_id).data.tags[card.NOTE]
    assert f"champion n={result.n['champion']}" in ab_note and result.reasons[0] in ab_note


def test_an_ab_decision_on_the_version_names_its_counts_and_reason(registered):
    from rl_core.ab.verdict import ABResult

    cfg = registered
    v2 = store.register_checkpoint(cfg, store.checkpoint_path(cfg, 1), run_name="r2", tags={"run_id": "r2"})
    why = "challenger has 0 interactions < min_samples_per_arm 50"
    result = ABResult(decision="continue", reasons=[why], since=START, until=END, champion_version=1,
                      challenger_version=v2, n={"champion": 85, "challenger": 0}, users={}, alpha=0.05,
                      min_samples_per_arm=50)
    card.log_ab(cfg, result)
    desc = store.get_version(cfg, v2).description
    assert f"| A/B | continue vs v1: champion n=85, challenger n=0; {why}" in desc, desc


def test_version_rows_stay_short_and_keep_the_story_in_the_history(registered, tiny_checkpoint):
    from rl_core.registry import promote

    cfg = registered
    write_run(cfg, "cycle-a", tiny_checkpoint, parent=1)
    v2 = register_run(cfg, "cycle-a")
    assert deploy(cfg, "cycle-a", v2)
    promote.promote(cfg, "A/B better", expected=v2)
    write_run(cfg, "cycle-b", tiny_checkpoint, parent=v2)
    v3 = register_run(cfg, "cycle-b")
    assert deploy(cfg, "cycle-b", v3)
    promote.promote(cfg, "A/B better again", expected=v3)
    promote.restore_previous_champion(cfg, "incident")
    tags = store.get_version(cfg, v3).tags
    dropped = {"alias.champion.removed_reason", "alias.challenger.removed_reason", "promoted_reason",
               "rolled_back_at", "promotion.reasons", "monitor.run", "ab.champion"}
    assert not dropped & set(tags), sorted(tags)
    assert len(tags) <= 23, sorted(tags)  # 27 for this story before the redundant tags went
    history = store.get_version(cfg, v3).description
    assert "`champion` moved to version" in store.get_version(cfg, v2).description
    assert "rolled back: incident" in history and "`challenger` removed: promoted to champion" in history


def test_run_names_have_one_format_and_the_docs_state_it(lifecycle):
    cfg, v2, _, result = lifecycle
    c = store.client(cfg)
    assert c.get_run(store.get_version(cfg, 1).run_id).info.run_name == f"v1-base-{cfg.model.base}"
    assert c.get_run(store.get_version(cfg, v2).run_id).info.run_name == f"v{v2}-cycle-a"
    assert c.get_run(result.mlflow_run_id).info.run_name == "ab-20261202T0500-20261202T1000"
    docs = (REPO / "docs" / "production.md").read_text()
    for stated in ("`train-<run_id>`", "`v<N>-<run_id>`", "`v1-base-<model>`", "`ab-<since>-<until>`",
                   "`cycle-20261202T1000`"):
        assert stated in docs, stated


def test_the_embedded_ui_starts_without_mlflows_job_queue(cfg):
    from lab.stack.mlflow_ui import ui_argv, ui_env

    argv, env = ui_argv(cfg, 5999), ui_env({"PATH": os.environ["PATH"]})
    assert argv[argv.index("--workers") + 1] == "1"
    assert env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
    make = (REPO / "Makefile").read_text()
    assert re.search(r"^mlflow: setup\n\t\$\(PY\) -m lab\.stack\.mlflow_ui$", make, re.M)


@pytest.mark.slow  # ~30 s: MLflow's UI server, and a headless Chromium when there is one
def test_the_ui_runs_in_two_processes_and_opens_the_runs_table_with_the_deciding_columns(lifecycle, tmp_path):
    from browser import Browser, chromium

    from lab.stack.mlflow_ui import links, start_ui
    from rl_core.runtime.procs import free_port, stop

    cfg, v2, v3, _ = lifecycle
    port = free_port()
    proc = start_ui(cfg, port, tmp_path / "mlflow.log")
    try:
        assert len(_tree(proc.pid)) <= 2, [_cmd(p) for p in _tree(proc.pid)]  # web server only, no job queue
        base = f"http://127.0.0.1:{port}"
        url = links(cfg, base)[0].split()[1]
        if chromium() is None:
            pytest.skip("no chromium: the process count was checked, the page was not")
        b = Browser(tmp_path / "chromium-profile")
        try:
            b.goto(url)
            b.wait_text(f"v{v2}-cycle-a", "_decide/1_reward_mean", "_decide/2_kl_mean", "_decide/3_eval_delta", timeout=90)
            text = b.text()
            assert "Model training" in text and "shared view" in text  # ML mode, the deciding columns' view
            cols = [line for line in text.splitlines() if line.startswith(layout.DECIDE)]
            assert cols[:2] == ["_decide/1_reward_mean", "_decide/1_reward_n"], cols  # the first columns shown
            runs = [store.get_version(cfg, v).run_id for v in (v2, v3)]
            b.goto(f"{base}/#/compare-runs?runs={json.dumps(runs)}&experiments={json.dumps([store.experiment_id(cfg)])}")
            b.wait_text("Artifacts", "eval_report.md", "verdicts.json", "reward_hist.png", timeout=90)
            assert "No common artifacts" not in b.text()
        finally:
            b.close()
    finally:
        stop(proc)


def _tree(root: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")[:120]
    except OSError:
        return "?"
