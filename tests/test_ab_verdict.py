"""A/B verdicts on simulated logs with planted effects, through the real lake + DuckDB SQL (sql/ab/), and the
decision rule on its own (decide: every branch, guardrail non-inferiority margins included)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow.compute as pc
import pytest

from lab.testing import ab_synth
from lab.testing.ab_synth import ArmSpec
from rl_core.ab.result import METRICS, MetricResult, noninferior
from rl_core.ab.verdict import ab_verdict, decide
from rl_core.lake import Lake

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


# --- non-inferiority guardrails ([ab] guardrail_margins) -----------------------------------------------------------

ENOUGH = {"champion": 5_000, "challenger": 5_000}


def metric(name: str, lo: float, hi: float) -> MetricResult:
    """A computed metric with the interval [lo, hi] (better / worse follow from it, as _metric sets them)."""
    up = METRICS[name] > 0
    d = (lo + hi) / 2
    return MetricResult(name=name, higher_is_better=up, champion=1.0, challenger=1.0 + d, diff=d, se=(hi - lo) / 3.92,
                        lo=lo, hi=hi, p_value=0.5, method="test", better=lo > 0 if up else hi < 0,
                        worse=hi < 0 if up else lo > 0)


def planted(primary=(0.01, 0.05), dissatisfied=(-0.02, 0.03), latency=(-40.0, 120.0)) -> dict[str, MetricResult]:
    """A significantly better primary; guardrails whose intervals cover 0 (not significantly worse)."""
    return {"edit_persisted_rate": metric("edit_persisted_rate", *primary),
            "dissatisfied_rate": metric("dissatisfied_rate", *dissatisfied),
            "latency_p90_ms": metric("latency_p90_ms", *latency)}


def test_without_margins_promote_needs_only_the_primary(cfg):
    assert cfg.ab.guardrail_margins == {}  # the default keeps the rule as it was
    decision, reasons = decide(planted(latency=(-40.0, 900.0)), ENOUGH, cfg)
    assert decision == "promote" and len(reasons) == 1 and reasons[0].startswith("edit_persisted_rate significantly better")


def test_promote_when_every_guardrail_with_a_margin_is_shown_noninferior(cfg):
    cfg.ab.guardrail_margins = {"dissatisfied_rate": 0.05, "latency_p90_ms": 250.0}
    decision, reasons = decide(planted(), ENOUGH, cfg)
    assert decision == "promote", reasons
    assert reasons[0].startswith("edit_persisted_rate significantly better")
    assert any(r.startswith("dissatisfied_rate non-inferior: upper bound +0.03") and "margin 0.05" in r for r in reasons)
    assert any(r.startswith("latency_p90_ms non-inferior: upper bound +120") and "margin 250" in r for r in reasons)


def test_a_guardrail_not_shown_noninferior_keeps_collecting(cfg):
    cfg.ab.guardrail_margins = {"dissatisfied_rate": 0.05, "latency_p90_ms": 250.0}
    decision, reasons = decide(planted(latency=(-40.0, 300.0)), ENOUGH, cfg)
    assert decision == "continue", reasons
    # the reason names the guardrail, its bound and its margin; the better primary is said too
    assert reasons[0].startswith("latency_p90_ms not shown non-inferior: upper bound +300")
    assert "margin 250" in reasons[0] and "needs < +250" in reasons[0]
    assert not any(r.startswith("dissatisfied_rate") for r in reasons)  # shown non-inferior: not a reason to wait
    assert reasons[-1].startswith("edit_persisted_rate significantly better")


def test_a_guardrail_that_was_not_computed_is_not_shown_noninferior(cfg):
    cfg.ab.guardrail_margins = {"latency_p90_ms": 250.0}
    metrics = planted()
    del metrics["latency_p90_ms"]
    decision, reasons = decide(metrics, ENOUGH, cfg)
    assert decision == "continue" and reasons[0] == "latency_p90_ms not shown non-inferior: not computed (margin 250)"


def test_significantly_worse_still_rolls_back_even_within_its_margin(cfg):
    cfg.ab.guardrail_margins = {"dissatisfied_rate": 0.05, "latency_p90_ms": 250.0}
    metrics = planted(dissatisfied=(0.01, 0.03))  # worse (lo > 0) though its upper bound is within the margin
    assert noninferior(0.01, 0.03, False, 0.05)
    decision, reasons = decide(metrics, ENOUGH, cfg)
    assert decision == "rollback" and reasons[0].startswith("dissatisfied_rate significantly worse")


def test_a_higher_is_better_guardrail_is_bounded_from_below(cfg):
    cfg.ab.guardrails = ["reward"]
    cfg.ab.guardrail_margins = {"reward": 0.1}
    shown = {**planted(), "reward": metric("reward", -0.08, 0.2)}
    assert decide(shown, ENOUGH, cfg)[0] == "promote"
    decision, reasons = decide({**planted(), "reward": metric("reward", -0.15, 0.2)}, ENOUGH, cfg)
    assert decision == "continue" and reasons[0].startswith("reward not shown non-inferior: lower bound -0.15")
    assert "needs > -0.1" in reasons[0]


def test_margins_change_nothing_before_min_samples_or_without_a_better_primary(cfg):
    cfg.ab.guardrail_margins = {"latency_p90_ms": 1.0}
    few = {"champion": 10, "challenger": 5_000}
    assert decide(planted(latency=(-40.0, 300.0)), few, cfg)[0] == "continue"
    decision, reasons = decide(planted(primary=(-0.01, 0.05)), ENOUGH, cfg)
    assert decision == "continue" and reasons[0].startswith("edit_persisted_rate not significant")


def test_noninferiority_without_an_interval_is_not_shown():
    nan = float("nan")
    assert not noninferior(nan, nan, False, 250.0) and not noninferior(nan, nan, True, 0.1)
    assert noninferior(-5.0, 249.9, False, 250.0) and not noninferior(-5.0, 250.0, False, 250.0)


def test_margins_through_the_lake_and_duckdb(cfg):
    """The same logged window, judged twice: a margin wider than the latency interval promotes, a margin it does not
    clear keeps collecting; each metric carries its margin and verdict, and the report states them."""
    from rl_core.ab.report import to_markdown

    simulate(cfg, 20_000, 2_000, ArmSpec(1, edit_persisted=0.30), ArmSpec(2, edit_persisted=0.34), seed=21)
    plain = verdict(cfg)
    assert plain.decision == "promote" and all(m.margin is None and m.noninferior is None
                                               for m in plain.metrics.values())
    lat = plain.metrics["latency_p90_ms"]
    assert not lat.worse and lat.hi > 5.0  # no real difference, an interval some ms wide

    cfg.ab.guardrail_margins = {"dissatisfied_rate": 0.05, "latency_p90_ms": 250.0}
    wide = verdict(cfg)
    assert wide.decision == "promote", wide.reasons
    assert wide.metrics["latency_p90_ms"].margin == 250.0 and wide.metrics["latency_p90_ms"].noninferior is True
    assert wide.metrics["dissatisfied_rate"].noninferior is True and wide.metrics["reward"].noninferior is None
    md = to_markdown(wide)
    assert "| guardrail | margin |" in md and "| latency_p90_ms | 250 |" in md and "| yes |" in md

    cfg.ab.guardrail_margins = {"dissatisfied_rate": 0.05, "latency_p90_ms": 1.0}
    tight = verdict(cfg)
    assert tight.decision == "continue" and tight.metrics["latency_p90_ms"].noninferior is False
    assert tight.reasons[0].startswith("latency_p90_ms not shown non-inferior") and "margin 1 " in tight.reasons[0]
    assert "| not shown |" in to_markdown(tight)


def test_margins_are_checked_when_the_config_loads(tmp_path):
    from rl_core.config import REPO_ROOT, ConfigError, load_config

    def load(margins: str, guardrails: str | None = None):
        env = {"RTRL_PROFILE": "tiny", "RTRL_HOME": str(tmp_path), "RTRL_AB__GUARDRAIL_MARGINS": margins}
        if guardrails:
            env["RTRL_AB__GUARDRAILS"] = guardrails
        return load_config(REPO_ROOT / "rtrl.toml", environ=env)

    assert load('{"dissatisfied_rate": 0.05, "latency_p90_ms": 250}').ab.guardrail_margins == {
        "dissatisfied_rate": 0.05, "latency_p90_ms": 250.0}
    assert load('{"latency_p50_ms": 250}', '["latency_p50_ms"]').ab.guardrail_margins == {"latency_p50_ms": 250.0}
    with pytest.raises(ConfigError, match=r"\[ab\] guardrail_margins.*'latency_p99' is not an A/B metric"):
        load('{"latency_p99": 250}')
    with pytest.raises(ConfigError, match=r"\[ab\] guardrail_margins.*dissatisfied_rate = -0.05.*>= 0"):
        load('{"dissatisfied_rate": -0.05}')
    with pytest.raises(ConfigError, match=r"\[ab\] guardrail_margins.*'reward' is not in \[ab\] guardrails"):
        load('{"reward": 0.1}')
    cfg = load("{}")
    cfg.ab.guardrail_margins = {"latency_p90_ms": 250.0}
    cfg.ab.guardrails = ["dissatisfied_rate"]  # changed after loading: the verdict refuses it, naming the field
    with pytest.raises(ValueError, match=r"\[ab\] guardrail_margins: 'latency_p90_ms' is not in \[ab\] guardrails"):
        ab_verdict(cfg, START, END, champion=1, challenger=2, log=False)
