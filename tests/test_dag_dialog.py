"""What the backfill dialog says (issue 41), read in Debian's headless Chromium as an operator reads it: the
single-run params in their own section that says a backfill refuses them, and the backfill's help (the open
window left out, the schedule's share with "Unpause on trigger"). The dry run behind its count is checked over
REST in tests/test_dag_scheduler.py; the refusal itself in tests/test_dag_window.py."""

from __future__ import annotations

import pytest

from tests.browser import Browser, chromium
from tests.test_dag_scheduler import standalone

SINGLE = "Single run only (a backfill refuses these)"  # the dialogs' section of the single-run params
needs_chromium = pytest.mark.skipif(chromium() is None, reason="needs Debian's chromium (`make test` installs it)")


@pytest.mark.slow
@pytest.mark.timeout(900)  # airflow standalone starts in 1-3 min here; nothing runs
@needs_chromium
def test_the_backfill_dialog_says_what_a_backfill_leaves_out_and_refuses(registered, tmp_path):
    browser = Browser(tmp_path / "chromium-profile")
    try:
        with standalone(registered, tmp_path) as af:
            browser.open_trigger_dialog(af.base, af.password)
            browser.wait_text(SINGLE)  # the single run's form shows the section too
            browser.js("document.querySelector('input[type=radio][value=backfill]').click()")
            browser.wait_text("Run Backfill - realtime_rl", "Date Range", SINGLE)
            browser.screenshot(tmp_path / "backfill-dialog.png")
            # Run Parameters opens by itself: dry_run's help says what a backfill leaves out and refuses
            browser.wait_text("that has ended", "still open is left out", "Unpause on trigger", "one run fewer",
                              "refuses start, end and policy_version")
            # the single-run section starts closed: open it with a real mouse click (the accordion ignores el.click())
            x, y = browser.js(f"""(() => {{ const b = [...document.querySelectorAll('button')].find(
                b => b.innerText.trim() === {SINGLE!r}); b.scrollIntoView({{block: 'center'}});
                const r = b.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; }})()""")
            for kind in ("mousePressed", "mouseReleased"):
                browser.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)
            browser.wait_text("Only for a run without a data interval",
                              "version to update (default: champion); a backfill refuses it", timeout=30)
            browser.screenshot(tmp_path / "backfill-dialog-single-run.png")
    finally:
        browser.close()
