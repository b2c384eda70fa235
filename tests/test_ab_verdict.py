"""A/B verdicts on simulated logs with planted effects, through the real lake + DuckDB SQL (sql/ab/)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow.compute as pc
import pytest

from rl_core.ab.verdict import ab_verdict
from rl_core.lake import Lake
from rl_core.testing import ab_synth
from rl_core.testing.ab_synth import ArmSpec

START = datetime(2026, 12, 2, 5, tzinfo=timezone.utc)
END = START + timedelta(hours=5)


def simulate(cfg, n, users, champion: ArmSpec, challenger: ArmSpec, seed=0, **kw):
    events, feedback = ab_synth.synth_ab(n, users, START, END, champion, challenger, seed=seed, **kw)
    lake = Lake(cfg.lake_root)
    ab_synth.write_to_lake(lake, "interactions", events)
    ab_synth.write_to_lake(lake, "feedback", feedback)
    return events, feedback


def verdict(cfg, **kw):
    return ab_verdict(cfg, START, END, champion=1, challenger=2, log=False, **kw)


def test_planted_edit_persisted_effect_promotes_at_adequate_size(cfg):
    simulate(cfg, 40_000, 4_000, ArmSpec(1, edit_persisted=0.30), ArmSpec(2, edit_persisted=0.33), seed=1)
    r = verdict(cfg)
    assert r.decision == "promote", r.reasons
    m = r.metrics["edit_persisted_rate"]
    assert m.better and m.lo > 0 and m.lo < 0.03 < m.hi  # the interval covers the planted +3 points
    assert not r.metrics["latency_p90_ms"].worse and not r.metrics["dissatisfied_rate"].worse
    assert min(r.n.values()) >= 19_000 and min(r.users.values()) > 1_500


def test_same_effect_at_small_size_continues(cfg):
    simulate(cfg, 60, 30, ArmSpec(1, edit_persisted=0.30), ArmSpec(2, edit_persisted=0.33), seed=2)
    r = verdict(cfg)
    assert r.decision == "continue"
    assert any("min_samples_per_arm" in reason for reason in r.reasons)


def test_same_effect_above_minimum_but_underpowered_continues(tmp_path):
    from rl_core.config import REPO_ROOT, load_config

    cfg = load_config(REPO_ROOT / "rtrl.toml", environ={"RTRL_PROFILE": "tiny", "RTRL_HOME": str(tmp_path)})
    simulate(cfg, 700, 120, ArmSpec(1, edit_persisted=0.30), ArmSpec(2, edit_persisted=0.33), seed=3)
    r = verdict(cfg)
    assert min(r.n.values()) >= cfg.ab.min_samples_per_arm
    assert r.decision == "continue" and "not significant" in r.reasons[0]
    assert r.metrics["edit_persisted_rate"].lo < 0 < r.metrics["edit_persisted_rate"].hi


def test_planted_latency_regression_rolls_back_even_with_better_edits(cfg):
    simulate(cfg, 20_000, 2_000, ArmSpec(1, edit_persisted=0.30, latency_median_ms=800),
             ArmSpec(2, edit_persisted=0.34, latency_median_ms=1000), seed=4)
    r = verdict(cfg)
    assert r.decision == "rollback", r.reasons
    assert r.metrics["latency_p90_ms"].worse and r.metrics["latency_p90_ms"].lo > 0
    assert r.metrics["edit_persisted_rate"].better  # better primary, but a guardrail is significantly worse
    assert any(reason.startswith("latency_p90_ms") for reason in r.reasons)


def test_dissatisfied_followups_guardrail_rolls_back(cfg):
    simulate(cfg, 20_000, 2_000, ArmSpec(1, dissatisfied=0.10), ArmSpec(2, dissatisfied=0.14), seed=5)
    r = verdict(cfg)
    assert r.decision == "rollback"
    assert r.metrics["dissatisfied_rate"].worse
    assert r.reasons[0].startswith("dissatisfied_rate")


def test_sql_counts_match_the_logs_and_replays_change_nothing(cfg):
    events, feedback = simulate(cfg, 3_000, 300, ArmSpec(1), ArmSpec(2, edit_persisted=0.4), seed=6)
    r = verdict(cfg)
    arms = np.asarray(events["arm"].to_pylist())
    assert r.n == {"champion": int((arms == "champion").sum()), "challenger": int((arms == "challenger").sum())}
    # feedback counts when it arrives before the window end + harvest.grace_hours
    on_time = feedback.filter(pc.less(feedback["ts"], END + timedelta(hours=cfg.harvest.grace_hours)))
    assert on_time.num_rows < feedback.num_rows  # the generator does produce some late feedback
    persisted_ids = set(pc.filter(on_time["event_id"], pc.equal(on_time["kind"], "edit_persisted")).to_pylist())
    reverted_ids = set(pc.filter(on_time["event_id"], pc.equal(on_time["kind"], "edit_reverted")).to_pylist())
    ids = np.asarray(events["event_id"].to_pylist())
    ok = np.array([i in persisted_ids and i not in reverted_ids for i in ids])
    for arm in ("champion", "challenger"):
        expect = ok[arms == arm].mean()
        got = getattr(r.metrics["edit_persisted_rate"], arm)
        assert got == pytest.approx(expect, abs=1e-12)
    lat = np.asarray(events["latency_ms"].to_pylist())
    assert r.metrics["latency_p90_ms"].challenger == pytest.approx(np.quantile(lat[arms == "challenger"], 0.9))

    # the same events and feedback delivered twice (replayed segments): the verdict is unchanged
    lake = Lake(cfg.lake_root)
    ab_synth.write_to_lake(lake, "interactions", events, tag="replay")
    ab_synth.write_to_lake(lake, "feedback", feedback, tag="replay")
    again = verdict(cfg)
    assert again.n == r.n
    assert again.metrics["edit_persisted_rate"].diff == pytest.approx(r.metrics["edit_persisted_rate"].diff)


def test_cuped_shrinks_the_interval_without_moving_the_estimate(cfg):
    simulate(cfg, 8_000, 800, ArmSpec(1), ArmSpec(2, edit_persisted=0.33), seed=7, user_sd=0.15,
             pre_hours=48, pre_n=16_000)
    plain = verdict(cfg, cuped=False).metrics["edit_persisted_rate"]
    cuped = verdict(cfg, cuped=True).metrics["edit_persisted_rate"]
    assert "CUPED" in cuped.method
    assert cuped.se < 0.85 * plain.se
    assert abs(cuped.diff - plain.diff) < 2 * plain.se


def test_bad_input_is_refused_with_the_field_named(cfg):
    with pytest.raises(ValueError, match="since"):
        ab_verdict(cfg, datetime(2026, 12, 2), END, champion=1, challenger=2, log=False)
    with pytest.raises(ValueError, match="after since"):
        ab_verdict(cfg, END, START, champion=1, challenger=2, log=False)
    cfg.ab.primary = "vibes"
    with pytest.raises(ValueError, match=r"\[ab\] primary"):
        verdict(cfg)
    cfg.ab.primary = "edit_persisted_rate"
    cfg.ab.guardrails = ["latency_p99"]
    with pytest.raises(ValueError, match=r"\[ab\] guardrails"):
        verdict(cfg)


def test_empty_window_continues(cfg):
    r = verdict(cfg)
    assert r.decision == "continue" and r.n == {"champion": 0, "challenger": 0} and r.metrics == {}
