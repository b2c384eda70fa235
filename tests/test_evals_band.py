"""The calibrated band (evals/band/) is exactly what its committed census selected, and can see a change."""

from __future__ import annotations

import json
import math
from pathlib import Path

from evals.tasks import load_tasks

REPO = Path(__file__).resolve().parent.parent
CENSUS = REPO / "docs" / "results" / "band-census-smollm2.json"


def test_the_band_is_the_census_selection_of_the_candidates():
    census = json.loads(CENSUS.read_text())
    low, high = census["meta"]["low"], census["meta"]["high"]
    rows = {r["task"]: r for r in census["tasks"]}
    candidates = {t.id: t for t in load_tasks(REPO / "bench" / "band")}
    assert set(rows) == set(candidates), "the census covers every candidate, and only them"
    for r in rows.values():
        assert len(r["outcomes"]) == r["samples"] == census["meta"]["samples"]
        assert r["passed"] == sum(r["outcomes"]) and math.isclose(r["pass_rate"], r["passed"] / r["samples"])
    band = {t.id: t for t in load_tasks(REPO / "evals" / "band")}
    assert set(band) == {i for i, r in rows.items() if low <= r["pass_rate"] <= high}
    assert all(band[i] == candidates[i] for i in band), "band tasks are the candidates, unchanged"
    assert len(band) >= 60 and all(t.target for t in band.values())
    assert {t.kind for t in band.values()} >= {"bugfix", "feature", "refactor"}


def test_the_band_has_the_power_the_gate_asks_for():
    """Design check before any run: at the default samples, independent draws at the census rates give a
    minimum detectable pass-rate change (80% power, z 1.96) within the default profile's eval.max_mde."""
    from rl_core.config import REPO_ROOT, load_config

    cfg = load_config(REPO_ROOT / "rtrl.toml", environ={"RTRL_PROFILE": "default"})
    ec = cfg.eval
    assert Path(cfg.path(ec.tasks_dir)) == REPO / "evals" / "band" and ec.max_mde > 0 and ec.temperature > 0
    census = json.loads(CENSUS.read_text())
    band = {t.id for t in load_tasks(REPO / "evals" / "band")}
    rates = [r["pass_rate"] for r in census["tasks"] if r["task"] in band]
    se = math.sqrt(sum(2 * p * (1 - p) / ec.samples for p in rates)) / len(rates)
    assert (ec.z + 0.8416) * se <= ec.max_mde
