"""docs/results.md is the claims page, and its numbers are bench/claims.py's, recomputed from the committed summaries.

bench/claims.py reads experiments/*/ (the protocols, the summaries), docs/results/*.json (the benchmarks' census)
and git (when each protocol was added) and prints every
number the page uses. Here it runs on the committed files: every line it prints must be in the page verbatim, and
every decimal of the page outside a quoted block (`>`: the numbers no committed summary holds, each saying where it
comes from) must be one it prints. A summary added or changed, or a number typed by hand, fails until the page says
what the summaries say. No mocks: the real script on the real files.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "results.md"
EXPERIMENTS = REPO / "experiments"
HISTORY = sorted(EXPERIMENTS.rglob("*.md"))  # the layout (README.md) and each experiment's run notes (history.md)
DECIMAL = re.compile(r"(?<![\w.])[+-]?\d+\.\d+(?!\w|\.\d)|(?<![\w.])\d+(?:\.\d+)?%")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.fixture(scope="module")
def printed() -> str:
    # the protocols were registered under bench/protocols/ before issue 42 moved them to experiments/
    log = subprocess.run(["git", "log", "-1", "--format=%h", "--", "bench/protocols", "experiments"], cwd=REPO,
                         capture_output=True, text=True)
    if log.returncode != 0 or not log.stdout.strip():
        pytest.skip("no git history of the protocols here: the registration order and commits come from it")
    out = subprocess.run([sys.executable, str(REPO / "bench" / "claims.py")], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _page_lines() -> list[str]:
    return PAGE.read_text().splitlines()


def test_every_line_claims_prints_is_on_the_page(printed):
    page = PAGE.read_text()
    missing = [line for line in printed.splitlines() if line.strip() and not line.startswith("## ")
               and line not in page]
    assert not missing, "docs/results.md lacks these lines of bench/claims.py (rerun it, paste them):\n" + "\n".join(missing)


def test_every_decimal_on_the_page_outside_a_quote_is_one_claims_prints(printed):
    known = set(DECIMAL.findall(printed))
    typed = [(n, tok, line) for n, line in enumerate(_page_lines(), 1) if not line.lstrip().startswith(">")
             for tok in DECIMAL.findall(line) if tok not in known]
    assert not typed, "numbers on the page that no committed summary gives (quote them with `>` and a source):\n" + \
        "\n".join(f"line {n}: {tok}: {line}" for n, tok, line in typed)


def test_pooled_results_registrations_and_protocol_files_agree_with_the_summaries(printed):
    # each pooled file equals the pool recomputed from its seeds; every protocol was in the code of its runs and
    # is the file they ran (sha256)
    assert "DIFFERS" not in printed and "| NO |" not in printed and "NOT in the code" not in printed, printed
    assert "registered rule met: yes" in printed  # the two registered results the page states as met


def test_the_page_is_a_claims_page():
    lines = _page_lines()
    assert len(lines) <= 210, f"docs/results.md has {len(lines)} lines; the history belongs in experiments/*/history.md"
    assert lines[2].startswith("Measured on: 2-core AMD EPYC, 24 GB, no GPU")
    claims = [line for line in lines if re.match(r"## \d\. ", line)]
    assert len(claims) >= 2
    text = PAGE.read_text()
    for head in ("**Question", "**Protocol.**", "**What it does not show.**"):
        assert text.count(head) >= len(claims), head
    assert text.count("**Designs registered before it.**") >= 2


def test_the_pages_links_resolve():
    for doc in (PAGE, *HISTORY):
        for target in LINK.findall(doc.read_text()):
            if "://" not in target:
                assert (doc.parent / target).exists(), f"{doc.relative_to(REPO)}: {target} does not exist"
    assert {str(p.relative_to(EXPERIMENTS)) for p in HISTORY} >= {
        "README.md", "shared-preference/history.md", "org-conventions/history.md", "coding-quality/history.md",
        "early-runs/history.md", "early-runs/make-cycle.md"}
