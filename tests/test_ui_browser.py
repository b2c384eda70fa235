"""The two UIs an operator lives in, used in a real browser (Debian's headless Chromium, tests/browser.py):
MLflow's compare view of two checkpoints shows what decides between them, and a backfill created from the
Airflow UI's dialog (the grid makes it one run) runs its window to success and registers its checkpoint.

Screenshots land in the test's folder; with RTRL_SCREENSHOTS=docs/img/ui they refresh the ones
docs/production.md shows, so the walk-throughs stay true.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from browser import Browser, chromium
from test_dag_scheduler import _data, failed_tasks, standalone
from test_registry_lifecycle import write_run

from rl_core.registry import layout

needs_chromium = pytest.mark.skipif(chromium() is None, reason="needs Debian's chromium (`make test` installs it)")


def shot(b: Browser, tmp_path: Path, name: str) -> Path:
    path = b.screenshot(tmp_path / "shots" / f"{name}.png")
    if out := os.environ.get("RTRL_SCREENSHOTS"):
        Path(out).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(out) / path.name)
    return path


def metric_rows(b: Browser) -> list[str]:
    """The compare view's metric names in the order its Metrics table lists them (its name column, read as the
    page's text: the names follow the "Metrics" heading and its "Show diff only" switch, the values come after)."""
    lines = b.text().splitlines()
    at = next(i for i, t in enumerate(lines) if t.strip() == "Metrics" and lines[i + 1].strip() == "Show diff only")
    names = []
    for t in lines[at + 2:]:
        if "/" not in t:
            break
        names.append(t.strip())
    return names


@pytest.fixture
def browser(tmp_path):
    b = Browser(tmp_path / "chromium-profile")
    yield b
    b.close()


@pytest.mark.slow  # ~1 min: MLflow's UI server starts in ~20-40 s here
@needs_chromium
def test_mlflow_compare_view_shows_reward_kl_eval_deltas_and_parent(registered, tiny_checkpoint, tmp_path, browser):
    from lab.cycle import start_mlflow
    from rl_core.registry import store
    from rl_core.registry.register import register_run
    from rl_core.runtime.procs import free_port, stop

    cfg = registered
    write_run(cfg, "cycle-a", tiny_checkpoint, parent=1)
    write_run(cfg, "cycle-b", tiny_checkpoint, parent=2, episodes=20)
    versions = [register_run(cfg, "cycle-a"), register_run(cfg, "cycle-b")]
    runs = [store.get_version(cfg, v).run_id for v in versions]
    port = free_port()
    proc = start_mlflow(cfg, port, tmp_path / "mlflow.log")
    try:
        base = f"http://127.0.0.1:{port}"
        exp = store.experiment_id(cfg)
        browser.goto(f"{base}/#/compare-runs?runs={json.dumps(runs)}&experiments={json.dumps([exp])}")
        # the deciding rows come first; MLflow renders the table lazily, so the rest of train/* may be below the fold
        browser.wait_text("reward/mean", "_decide/2_kl_mean", "train/kl_max", "eval/delta_pass_rate", "parent_version",
                          timeout=90)
        page = browser.text()
        assert f"v{versions[0]}-cycle-a" in page and f"v{versions[1]}-cycle-b" in page  # names say the version
        browser.click_label("close")  # MLflow's assistant side panel, when it opens by itself
        # the metrics table opens on the deciding numbers: reward, KL, the eval delta with its CI, in that order
        rows = metric_rows(browser)
        decide = [r.removeprefix(layout.DECIDE) for r in rows if r.startswith(layout.DECIDE)]
        assert rows[:len(decide)] == [layout.DECIDE + d for d in decide], rows  # before every other metric
        assert decide[:5] == ["1_reward_mean", "1_reward_n", "2_kl_max", "2_kl_mean", "3_eval_delta"], rows
        browser.scroll_to("Metrics")
        shot(browser, tmp_path, "mlflow-compare")
        # and the artifacts both runs have, side by side (the card, charts, eval report, verdicts)
        browser.scroll_to("Artifacts")
        browser.wait_text(*layout.COMMON_FILES["train"], timeout=30)
        assert "No common artifacts to display" not in browser.text()
        browser.click("eval_deltas.png", "*")  # both runs' eval charts side by side
        browser.wait("!document.body.innerText.includes('Select a file to preview') && [...document.images].filter("
                     "i => i.complete && i.naturalWidth > 200).length >= 2", 30, what="both runs' eval_deltas.png")
        shot(browser, tmp_path, "mlflow-compare-artifacts")

        browser.goto(f"{base}/#/models/{cfg.mlflow.model_name}/versions/{versions[1]}")
        browser.wait_text("reward mean", "KL mean / max", "eval pass-rate deltas", timeout=60)
        assert f"v{versions[0]}" in browser.text()  # the parent, in the description's table
        shot(browser, tmp_path, "mlflow-version")
    finally:
        stop(proc)


# one window of the 5 h grid (anchor 2026-01-01T00:00Z): [04:00, 09:00) on 2026-12-01
WINDOW = (datetime(2026, 12, 1, 4, tzinfo=UTC), datetime(2026, 12, 1, 9, tzinfo=UTC))
BACKFILL_RUN = f"backfill__{WINDOW[1].isoformat()}"  # a grid run's logical date is its window's end


def set_datetime(b: Browser, index: int, when: datetime) -> None:
    """Airflow's date-time field, the index-th of those visible: a popover with a YYYY/MM/DD and an HH:mm input (UTC,
    the UI's default zone)."""
    trigger = b.js("[...document.querySelectorAll('[data-testid=datetime-input]')].filter(e => e.offsetParent !== null)"
                   f"[{index}].id")
    content = trigger.replace(":trigger", ":content")
    opened = f"(document.getElementById('{content}') || {{}}).getAttribute?.('data-state') === 'open'"
    if not b.js(opened):
        b.js(f"document.getElementById('{trigger}').click()")
    b.wait(opened, 10, what="the date-time popover")
    b.fill(f"[id='{content}'] input[placeholder='YYYY/MM/DD']", f"{when:%Y/%m/%d}")
    b.fill(f"[id='{content}'] input[placeholder='HH:mm']", f"{when:%H:%M}")
    b.key("Escape")
    b.wait(f"!({opened})", 10, what="the popover to close")


MANUAL = (datetime(2026, 12, 1, 10, 0, tzinfo=UTC), datetime(2026, 12, 1, 12, 30, tzinfo=UTC))  # off the grid, no traffic
REFUSED_AT = datetime(2026, 12, 2, 10, tzinfo=UTC)  # a logical date whose grid window the params below contradict
REFUSED_PARAMS = {"start": "2026-12-02T04:30:00+00:00", "end": "2026-12-02T10:30:00+00:00"}


def trigger_single_run(b: Browser, base: str, window: tuple[datetime, datetime], tmp_path: Path) -> None:
    """Trigger -> Single Run with Data Interval "Specify Manually" set to window (the logical date left as the form
    fills it): what docs/production.md tells an operator to do for a window off the grid."""
    b.goto(f"{base}/dags/realtime_rl")
    b.wait_text("realtime_rl", "Backfills")
    assert b.click_label("Trigger Dag", timeout=30), b.buttons()
    b.wait_text("Single Run", "Data Interval")
    b.click("Specify Manually", "label, span")
    visible = "[...document.querySelectorAll('[data-testid=datetime-input]')].filter(e => e.offsetParent !== null)"
    b.wait(f"{visible}.length === 3", 10, what="Logical Date, Start and End")
    set_datetime(b, 1, window[0])
    set_datetime(b, 2, window[1])
    shot(b, tmp_path, "airflow-trigger-window")
    b.click("Trigger", "button")
    b.wait_text("Dag run has been successfully triggered")


def run_page_says(b: Browser, base: str, run_id: str, window: tuple[datetime, datetime], outcome: str) -> str:
    """The run's page as an operator opens it from the runs list: its note is the outcome line, its data interval
    the window (as the Details tab lists it, in the UI's UTC). Returns the page's text."""
    b.goto(f"{base}/dags/realtime_rl/runs/{run_id}/details")
    b.wait_text(outcome, "Data Interval Start", timeout=60)
    text = b.text()
    for label, when in (("Data Interval Start", window[0]), ("Data Interval End", window[1])):
        shown = text[text.index(label) + len(label):].strip().splitlines()[0]
        assert shown.startswith(f"{when:%Y-%m-%d %H:%M}"), (label, shown)
    return text


def wait_run(api, run_id: str, states: set[str], log: Path, timeout: float = 900) -> str:
    deadline = time.time() + timeout
    while (state := api.get(f"/dags/realtime_rl/dagRuns/{run_id}").json().get("state")) not in states:
        assert state not in ("success", "failed"), (state, failed_tasks(api, [run_id]))
        assert time.time() < deadline, (state, log.read_text()[-3000:])
        time.sleep(5)
    return state


@pytest.mark.slow
@pytest.mark.timeout(1500)  # airflow standalone starts in 1-3 min here, the backfilled cycle takes ~3 min, two short runs
@needs_chromium
def test_runs_from_the_airflow_ui_show_their_window_and_their_outcome(registered, tmp_path, browser):
    """A backfill from the Trigger dialog (registers v2), a single run with a manual data interval (no traffic:
    skipped) and a run whose params contradict its interval (refused): each run's page shows its window as its data
    interval and its outcome line as its note."""
    from rl_core.registry import store

    cfg = registered
    _data(cfg, *WINDOW, seed=3)  # a seed whose few users span both orgs (gate_episodes' max_org_share)
    with standalone(cfg, tmp_path) as af:
        base, api, log = af.base, af.api, af.log
        browser.sign_in(base, af.password)
        trigger_single_run(browser, base, MANUAL, tmp_path)
        manual = [r for r in api.get("/dags/realtime_rl/dagRuns").json()["dag_runs"] if r["run_type"] == "manual"]
        assert len(manual) == 1, manual
        wait_run(api, manual[0]["dag_run_id"], {"success"}, log)
        run_page_says(browser, base, manual[0]["dag_run_id"], MANUAL, "skipped: no traffic in [2026-12-01T10:00:00")
        shot(browser, tmp_path, "airflow-run-skipped")

        r = api.post("/dags/realtime_rl/dagRuns", json={"logical_date": REFUSED_AT.isoformat(), "conf": REFUSED_PARAMS})
        assert r.status_code == 200, r.text
        refused = r.json()["dag_run_id"]
        wait_run(api, refused, {"failed"}, log)
        grid = (REFUSED_AT - timedelta(hours=5), REFUSED_AT)
        run_page_says(browser, base, refused, grid, "refused by window: params start/end name the window")
        shot(browser, tmp_path, "airflow-run-refused")

        # as a person does: sign in, open the DAG, Trigger -> Backfill, pick the window, run it
        browser.goto(f"{base}/dags/realtime_rl")
        browser.wait_text("realtime_rl", "Backfills")
        assert browser.click_label("Trigger Dag", timeout=30), browser.buttons()
        browser.js("document.querySelector('input[type=radio][value=backfill]').click()")
        browser.wait_text("Run Backfill - realtime_rl", "Date Range")
        set_datetime(browser, 0, WINDOW[0])
        set_datetime(browser, 1, WINDOW[1])
        browser.wait_text("1 run will be triggered.")  # the grid timetable: one window, one run
        shot(browser, tmp_path, "airflow-backfill-dialog")
        browser.click("Run Backfill", "button")
        browser.wait_text("Backfill in progress")
        wait_run(api, BACKFILL_RUN, {"success"}, log)
        run_page_says(browser, base, BACKFILL_RUN, WINDOW, "registered v2 -> challenger")
        shot(browser, tmp_path, "airflow-run-registered")

        browser.goto(f"{base}/dags/realtime_rl/runs")
        browser.wait_text(BACKFILL_RUN, "Backfill", "Success", "Failed")
        shot(browser, tmp_path, "airflow-runs")
        notes = {r["dag_run_id"]: r["note"] for r in api.get("/dags/realtime_rl/dagRuns").json()["dag_runs"]}
        assert notes[BACKFILL_RUN].startswith("registered v2 -> challenger"), notes
    v2 = store.version_for_alias(cfg, "challenger")
    assert v2 == 2 and store.get_version(cfg, 2).tags["airflow.run_id"] == BACKFILL_RUN
