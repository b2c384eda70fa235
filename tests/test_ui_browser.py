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
from datetime import UTC, datetime
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
    from rl_core.cycle import start_mlflow
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
        browser.wait_text("reward/mean", "train/kl_mean", "eval/delta_pass_rate", "parent_version", timeout=90)
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
    """Airflow's date-time field: a popover with a YYYY/MM/DD and an HH:mm input (UTC, the UI's default zone)."""
    trigger = b.js(f"document.querySelectorAll('[data-testid=datetime-input]')[{index}].id")
    content = trigger.replace(":trigger", ":content")
    opened = f"(document.getElementById('{content}') || {{}}).getAttribute?.('data-state') === 'open'"
    if not b.js(opened):
        b.js(f"document.getElementById('{trigger}').click()")
    b.wait(opened, 10, what="the date-time popover")
    b.fill(f"[id='{content}'] input[placeholder='YYYY/MM/DD']", f"{when:%Y/%m/%d}")
    b.fill(f"[id='{content}'] input[placeholder='HH:mm']", f"{when:%H:%M}")
    b.key("Escape")
    b.wait(f"!({opened})", 10, what="the popover to close")


@pytest.mark.slow
@pytest.mark.timeout(1200)  # airflow standalone starts in 1-3 min here, the backfilled cycle takes ~3 min
@needs_chromium
def test_backfill_created_in_the_airflow_ui_runs_its_window_to_success(registered, tmp_path, browser):
    from rl_core.registry import store

    cfg = registered
    _data(cfg, *WINDOW, seed=3)  # a seed whose few users span both orgs (gate_episodes' max_org_share)
    with standalone(cfg, tmp_path) as af:
        base, api, log = af.base, af.api, af.log
        # as a person does: sign in, open the DAG, Trigger -> Backfill, pick the window, run it
        browser.open_trigger_dialog(base, af.password)
        browser.js("document.querySelector('input[type=radio][value=backfill]').click()")
        browser.wait_text("Run Backfill - realtime_rl", "Date Range")
        set_datetime(browser, 0, WINDOW[0])
        set_datetime(browser, 1, WINDOW[1])
        browser.wait_text("1 run will be triggered.")  # the grid timetable: one window, one run
        shot(browser, tmp_path, "airflow-backfill-dialog")
        browser.click("Run Backfill", "button")
        browser.wait_text("Backfill in progress")

        deadline = time.time() + 900
        while (state := api.get(f"/dags/realtime_rl/dagRuns/{BACKFILL_RUN}").json().get("state")) != "success":
            assert state != "failed", failed_tasks(api, [BACKFILL_RUN])
            assert time.time() < deadline, (state, log.read_text()[-3000:])
            time.sleep(5)
        browser.goto(f"{base}/dags/realtime_rl/runs")
        browser.wait_text(BACKFILL_RUN, "Backfill", "Success")
        shot(browser, tmp_path, "airflow-backfill-runs")
    v2 = store.version_for_alias(cfg, "challenger")
    assert v2 == 2 and store.get_version(cfg, 2).tags["airflow.run_id"] == BACKFILL_RUN
