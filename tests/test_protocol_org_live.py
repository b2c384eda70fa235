"""An organisations protocol measured live with a control arm in each org (lab/simulate/org_live.py): the DiD
whose drift cancels within each org, its SE, the per-org A/B and the guard in the summary and the report, the pooled
rule over seeds, the measured cycles' own size, and the registered org-conventions-v13-live file.

No model and no gateway: the per-request records, the A/B results and the lake's answers are built here."""

from __future__ import annotations

import math
import re
import tomllib
from datetime import datetime, timezone
from pathlib import Path

import pytest

from lab.simulate import heldout, org_live
from lab.simulate.experiment import CycleMetrics
from lab.simulate.org_protocol import pooled_orgs, random_effects, welch
from lab.simulate.protocol import load_protocol, markdown, seed_summary
from rl_core.ab.result import MetricResult, OrgABResult
from rl_core.config import Preference

REPO = Path(__file__).resolve().parent.parent
ORGS = REPO / "experiments" / "org-conventions"  # the question's protocols, v1 to v13
V13 = ORGS / "org-conventions-v13-live.toml"
CONV = {"org-acme": Preference(feature="summary_first", want=True),
        "org-globex": Preference(feature="summary_first", want=False)}


def _records(rates: dict[str, float], n: int = 4, adapter: dict[str, str | None] | None = None) -> list[dict]:
    """n requests per user, the first round(rate x n) of them with summary_first (and writes_code on every one)."""
    return [{"user_id": u, "task_id": f"t{i}", "event_id": f"{u}-{i}", "outcome": "edit_passed",
             "edit_persisted": True, "edit_reverted": False, "dissatisfied": False, "followup": None, "thumbs": [],
             "thumbs_dropped": 0, "thumbs_flipped": 0, "latency_ms": 10.0,
             "adapter_version": (adapter or {}).get(u),
             "features": ["writes_code"] + (["summary_first"] if i < round(r * n) else [])}
            for u, r in rates.items() for i in range(n)]


def _users(org: str, k: int) -> list[str]:
    return [f"{org}-u{i:03d}" for i in range(k)]


def _arms(users: list[str]) -> dict[str, str]:
    return {u: "adapter" if i % 2 == 0 else "base" for i, u in enumerate(users)}


def _world(changes: dict[tuple[str, str], list[float]]) -> tuple[list[dict], list[dict], dict[str, str]]:
    """Baseline and measured records where each (org, arm)'s users change by the given amounts (baseline 0.5)."""
    first, last, arms = {}, {}, {}
    for (org, arm), ds in changes.items():
        for i, d in enumerate(ds):
            u = f"{org}-{arm}-u{i:03d}"
            first[u], last[u], arms[u] = 0.5, 0.5 + d, arm
    return _records(first), _records(last), arms


def test_the_did_with_a_control_arm_subtracts_each_orgs_base_arm_and_adds_the_two_variances():
    changes = {("org-acme", "adapter"): [0.5, 0.25, 0.5, 0.25], ("org-acme", "base"): [0.0, 0.25, 0.0, -0.25],
               ("org-globex", "adapter"): [-0.25, 0.0, -0.25, -0.5], ("org-globex", "base"): [0.0, 0.25, 0.0, 0.0]}
    first, last, arms = _world(changes)
    t = org_live.arm_did(CONV, "summary_first", first, last, arms)
    acme = welch(changes["org-acme", "adapter"], changes["org-acme", "base"])
    globex = welch(changes["org-globex", "adapter"], changes["org-globex", "base"])
    assert acme["diff"] == pytest.approx(0.375) and globex["diff"] == pytest.approx(-0.3125)
    did = t["did"]
    assert did["diff"] == pytest.approx(0.375 + 0.3125) and did["control_arm"]
    assert did["se"] == pytest.approx(math.sqrt(acme["se"] ** 2 + globex["se"] ** 2))
    assert did["ci_low"] > 0 and did["n_a"] == 8 and did["n_b"] == 8 and did["df"] > 5
    m = t["org_moves"]["org-acme"]
    assert m["mean_rate_change"] == pytest.approx(0.375) and m["adapter_arm"] == {"users": 4, "mean_change": 0.375}
    assert m["base_arm"]["mean_change"] == pytest.approx(0.0) and m["ci_low"] == pytest.approx(acme["ci_low"])
    assert set(t["user_arms"]) == set(t["user_rate_diffs"]) and len(t["user_rate_diffs"]) == 16


def test_a_drift_both_arms_of_an_org_share_cancels_though_the_old_did_sees_it():
    # every acme user moved up, every globex user down, adapter or not: a window effect, no adapter effect
    up, down = [0.25, 0.5, 0.25, 0.0, 0.5], [-0.25, -0.5, 0.0, -0.25, -0.5]
    changes = {("org-acme", "adapter"): up, ("org-acme", "base"): list(reversed(up)),
               ("org-globex", "adapter"): down, ("org-globex", "base"): list(reversed(down))}
    first, last, arms = _world(changes)
    did = org_live.arm_did(CONV, "summary_first", first, last, arms)["did"]
    assert did["diff"] == pytest.approx(0.0, abs=1e-12) and did["ci_low"] < 0 < did["ci_high"]
    assert welch(up + up, down + down)["ci_low"] > 0.4  # without the control arm it reads as a large DiD


def test_the_gateways_split_is_the_arm_and_a_request_served_otherwise_is_caught():
    users = _users("org-acme", 40) + _users("org-globex", 40)
    arms = org_live.user_arms(users, ["org-acme", "org-globex"], 0.5)
    from rl_core.orgs.serving import in_adapter_arm

    assert all((arms[u] == "adapter") == in_adapter_arm(u.rsplit("-u", 1)[0], u, 0.5) for u in users)
    assert 10 < sum(a == "adapter" for a in arms.values()) < 70  # about half
    served = {u: (f"{u.rsplit('-u', 1)[0]}-v1-0123abcd" if arms[u] == "adapter" else None) for u in users}
    ok = org_live.served_as_assigned(_records(dict.fromkeys(users, 0.5), adapter=served), arms, ["org-acme", "org-globex"])
    assert ok["ok"] and ok["requests"] == 320
    leak = dict(served) | {users[0]: "org-globex-v1-0123abcd" if arms[users[0]] == "adapter" else "org-acme-v1-x"}
    bad = org_live.served_as_assigned(_records(dict.fromkeys(users, 0.5), adapter=leak), arms, ["org-acme", "org-globex"])
    assert not bad["ok"] and bad["not_as_assigned"]["org-acme"] == 4


def _metric(name: str, diff: float, lo: float, hi: float, margin: float | None = None) -> MetricResult:
    return MetricResult(name=name, higher_is_better=name != "dissatisfied_rate", champion=0.3, challenger=0.3 + diff,
                        diff=diff, se=(hi - lo) / 4, lo=lo, hi=hi, p_value=0.5, method="clustered delta method",
                        better=lo > 0, worse=hi < 0, margin=margin,
                        noninferior=None if margin is None else hi < margin)


def _fake_ab(decisions: dict[str, str], dis_hi: float = 0.03):
    def ab(cfg, org, since, until):
        return OrgABResult(decision=decisions[org], reasons=["r"], since=since, until=until, champion_version=1,
                           challenger_version=1, n={"champion": 96, "challenger": 96},
                           users={"champion": 24, "challenger": 24}, alpha=0.05, min_samples_per_arm=50,
                           org_id=org, base_version=1, adapter_version=f"{org}-v1-0123abcd", adapter_model_version=1,
                           metrics={"reward": _metric("reward", 0.05, -0.02, 0.12),
                                    "dissatisfied_rate": _metric("dissatisfied_rate", -0.01, -0.05, dis_hi, 0.05)})
    return ab


def _live_curves(cfg, effect: float) -> list[CycleMetrics]:
    """Baseline, trained and measured cycles of 12 users an org, split by the gateway's hash; in the measured
    cycle every user drifts by -0.25, 0 or +0.25 and the adapter arm moves toward its org's convention by `effect`
    (a multiple of 0.25: 4 requests a user); every answer has code."""
    users = _users("org-acme", 12) + _users("org-globex", 12)
    arms = org_live.user_arms(users, ["org-acme", "org-globex"], cfg.orgs.ab_share)
    drift = {u: (i % 3 - 1) * 0.25 for i, u in enumerate(users)}
    last = {u: 0.5 + drift[u] + (effect if arms[u] == "adapter" else 0) * (1 if "acme" in u else -1) for u in users}
    served = {u: f"{u.rsplit('-u', 1)[0]}-v1-0123abcd" if arms[u] == "adapter" else None for u in users}
    recs = [_records(dict.fromkeys(users, 0.5)), _records(dict.fromkeys(users, 0.5)), _records(last, adapter=served)]
    rate = {"summary_first": {"k": 48, "n": 96, "rate": 0.5, "ci_low": 0.4, "ci_high": 0.6}}
    return [CycleMetrics(k, f"run-{k}", 0, 96, 96, 0.0, None, None, None, None, None, None, {}, {"1": 96},
                         requests=r, role=role, feature_rates=rate,
                         window=[f"2026-12-0{k}T00:00:00+00:00", f"2026-12-0{k}T05:00:00+00:00"])
            for k, (r, role) in enumerate(zip(recs, ("baseline", "train", "measured"), strict=True), start=1)]


def _live_summary(cfg, monkeypatch, effect: float, decisions: dict[str, str] | None = None, seed: int = 47) -> dict:
    cfg.simulate.conventions, cfg.orgs.ab_share = CONV, 0.5
    curves = _live_curves(cfg, effect)
    monkeypatch.setattr(org_live, "adapters_served", lambda cfg, curves: {
        o: {"none": 40, f"{o}-v1-0123abcd": 56} for o in CONV})
    monkeypatch.setattr(org_live, "org_verdicts", lambda cfg, trained: {
        o: {"train": True, "eval": True, "eval_org": True, "monitors": True} for o in CONV})
    orgs = org_live.live_summary(cfg, "summary_first", curves, "writes_code", 0.05,
                                 ab=_fake_ab(decisions or {"org-acme": "continue", "org-globex": "continue"}))
    judged = {"monitors": {"passed": True, "reasons": []}, "ab": {"decision": "n/a"}, "orgs": orgs,
              "adapter_kl": {"run-2": {"org-acme": 0.01, "org-globex": 0.012}},
              "phases": {"experiment_s": 100.0, "judge_s": 5.0, "org_ab_s": 2.0, "cycles": {}}}
    return seed_summary(load_protocol(V13), V13, seed, curves, judged, 150.0, "c0ffee")


def test_the_summary_carries_the_per_org_ab_the_did_and_the_guards_and_the_report_prints_them(cfg, monkeypatch):
    s = _live_summary(cfg, monkeypatch, 0.25)
    o = s["orgs"]
    t = org_live.arm_did(CONV, "summary_first", s["requests"]["first"], s["requests"]["last"], o["user_arms"])
    assert o["did"] == t["did"] and o["did"]["diff"] == pytest.approx(0.5, abs=0.2) and o["did"]["ci_low"] > 0
    assert o["org_ab"]["org-acme"]["decision"] == "continue" and o["org_ab"]["org-acme"]["n"]["challenger"] == 96
    dis = o["org_ab"]["org-globex"]["metrics"]["dissatisfied_rate"]
    assert dis["diff"] == -0.01 and dis["lo"] == -0.05 and dis["hi"] == 0.03 and dis["noninferior"]
    assert o["org_ab"]["org-acme"]["command"].startswith("rtrl ab --org org-acme --since 2026-12-03T00:00")
    assert o["guard"]["org-acme"]["mean_rate_change"] == pytest.approx(0.0) and o["ab_share"] == 0.5
    assert {k for k, v in s["checks"].items() if not v} == set()
    assert {"did_excludes_zero", "each_org_moves_toward_its_convention", "arms_served_as_assigned",
            "adapters_isolated", "each_org_served_its_adapter"} <= set(s["checks"])
    # one seed's guards are reported, not judged: the rule judges them over every seed (pooled_live)
    assert o["seed_guards"] == {"guard_noninferior": True, "org_ab_no_rollback": True,
                                "org_ab_dissatisfied_noninferior": True}
    # what a reader needs to check it: the raw per-request records (with the adapter that answered), KL, phases
    assert s["requests"]["last"][0]["adapter_version"] in (None, "org-acme-v1-0123abcd")
    assert len(s["requests"]["first"]) == len(s["requests"]["last"]) == 96
    assert s["adapter_kl"]["run-2"]["org-acme"] == 0.01 and s["phases"]["org_ab_s"] == 2.0
    assert set(o["user_arms"]) == set(o["user_rate_diffs"])
    md = markdown([s], None)
    assert f"seed 47, live with a control arm (ab_share 0.5): DiD {o['did']['diff']:+.3f} (SE" in md
    assert re.search(r"- org-acme \(wants summary_first\): adapter arm - base arm \+0\.\d{3} \[", md)
    assert "`rtrl ab --org org-globex --since 2026-12-03T00:00:00+00:00 --until 2026-12-03T05:00:00+00:00`: continue" in md
    assert "dissatisfied_rate -0.010 [-0.050, +0.030]" in md and "guard writes_code +0.000" in md


def test_the_guards_are_judged_over_every_seed_and_an_adapter_rolled_back_twice_fails_the_rule(cfg, monkeypatch):
    from lab.simulate.protocol import _pool

    proto = load_protocol(V13)
    back = {"org-acme": "promote", "org-globex": "rollback"}
    one = _live_summary(cfg, monkeypatch, 0.25, back)
    assert one["orgs"]["seed_guards"]["org_ab_no_rollback"] is False and all(one["checks"].values())
    rest = [_live_summary(cfg, monkeypatch, 0.25, seed=k) for k in (48, 49, 50, 51, 52)]
    ok = _pool([one, *rest], proto)
    g = ok["guards"]
    assert g["org_ab_rollbacks"] == {"org-acme": 0, "org-globex": 1} and all(g["checks"].values())
    assert g["guard"]["org-acme"]["mean_rate_change"] == pytest.approx(0.0) and g["guard"]["org-acme"]["noninferior"]
    assert g["dissatisfied_rate"]["org-globex"]["noninferior"] and ok["success"] and ok["pool"] == "seeds_random"
    twice = _pool([one, _live_summary(cfg, monkeypatch, 0.5, back, seed=48), *rest[1:]], proto)
    assert not twice["guards"]["checks"]["org_ab_rollbacks_at_most_one_seed"] and not twice["success"]
    md = markdown([one, *rest], ok)
    assert "guards over every seed's users (adapter arm - base arm): org-acme writes_code +0.000" in md
    assert "A/B rollbacks per org {'org-acme': 0, 'org-globex': 1}" in md and "success: True" in md
    cfg.orgs.ab_share = 0.5
    worse = org_live.ab_record(_fake_ab({"org-acme": "continue"}, dis_hi=0.12)(cfg, "org-acme", *(
        datetime(2026, 12, 3, h, tzinfo=timezone.utc) for h in (0, 5))), 0.10)
    assert worse["dissatisfied_noninferior"] == {"margin": 0.05, "noninferior": False}  # the A/B's own margin


def test_seeds_with_a_control_arm_pool_arm_by_arm_and_the_seed_as_a_random_effect(cfg, monkeypatch):
    a, b = _live_summary(cfg, monkeypatch, 0.25, seed=47), _live_summary(cfg, monkeypatch, 0.5, seed=48)
    users = pooled_orgs([a, b], "v13", [47, 48], 0)
    assert users["did"]["control_arm"] and users["n_users"] == 48
    # the seeds' users arm by arm: the same as one seed holding both seeds' users
    both = org_live.arm_did(CONV, "summary_first", *org_live._tagged([a, b]))
    assert users["did"] == both["did"] and users["each_org_moves_toward_its_convention"]
    assert users["org_moves"]["org-acme"]["adapter_arm"]["users"] > 0
    re_ = pooled_orgs([a, b], "v13", [47, 48], 0, pool="seeds_random")
    assert re_["seed_random_effect"]["seeds"] == 2 and re_["diff"] == re_["seed_random_effect"]["diff"]
    per = [x["orgs"]["did"] for x in (a, b)]  # each seed's own control-arm DiD and SE
    assert re_["seed_random_effect"] == random_effects([d["diff"] for d in per], [d["se"] for d in per])
    # a seed whose own CI is entirely below zero fails the rule, whatever the pool says
    neg = _live_summary(cfg, monkeypatch, -0.5, seed=49)  # each org's adapter away from it
    assert neg["orgs"]["did"]["ci_high"] < 0
    p = pooled_orgs([a, b, neg], "v13", [47, 48, 49], 0)
    assert p["seeds_below_zero"] == 1 and not p["success"]
    assert "1 entirely below" in markdown([], pooled_orgs([a, b, neg], "v13", [47, 48, 49], 0, "seeds_random"))


def test_the_measured_cycles_can_serve_more_users_than_the_trained_one(cfg):
    design = heldout.Design(heldout=0.3, baseline=True, rate_share=0.3, flip=0.15, measure_users=96,
                            measure_interactions=384)
    plans, record = heldout.plans(design, 2, True, 47, [])
    assert [(p.role, p.n_users, p.interactions) for p in plans] == [
        ("baseline", 96, 384), ("train", None, None), ("measured", 96, 384)]
    assert record["measure_users"] == 96 and record["measure_interactions"] == 384
    from lab.simulate.personas import make_users, orgs_from_config
    from rl_core.config import load_config

    orgs = orgs_from_config(load_config())
    trained = heldout.users_of(plans[1], 24, orgs, 47)
    measured = heldout.users_of(plans[2], 24, orgs, 47)
    assert len(trained) == 24 and len(measured) == 96 and measured[:24] == trained == make_users(24, orgs, 47)


def test_the_registered_protocol_loads_freezes_v10s_training_and_uses_fresh_seeds(cfg):
    proto = load_protocol(V13)  # validates its config overrides through the Config model too
    v10 = tomllib.loads((ORGS / "org-conventions-v10.toml").read_text())["protocol"]
    table = tomllib.loads(V13.read_text())["protocol"]
    assert proto.dag == "orgs" and proto.measure == "live" and proto.baseline and proto.heldout == 0.3
    assert proto.rate_share == 0.3 and proto.flip == 0.15 and proto.pool == "seeds_random" and len(proto.seeds) >= 6
    assert table["config"]["orgs"] == {"ab_share": 0.5} and proto.registered == "2026-12-07"
    for section in ("simulate", "rewards", "train"):  # the training, exactly v10's
        assert table["config"][section] == v10["config"][section], section
    assert table["config"]["serving"]["backend"] == v10["config"]["serving"]["backend"]
    assert (proto.users, proto.interactions, proto.train_from, proto.feature) == (
        v10["users"], v10["interactions"], v10["train_from"], v10["feature"])
    used = {k for p in (REPO / "experiments").glob("*/*.toml") if p != V13
            for k in tomllib.loads(p.read_text())["protocol"]["seeds"]}
    assert not set(proto.seeds) & used
    from lab.simulate.protocol import env_of
    from rl_core.config import load_config

    run = load_config(environ=env_of(proto, proto.seeds[0]))
    assert run.orgs.ab_share == 0.5 and run.ab.guardrail_margins == {"dissatisfied_rate": 0.10}
    assert "POWER ANALYSIS" in V13.read_text().split("[protocol]")[0]


def test_measure_sizes_and_a_live_guard_are_refused_where_they_mean_nothing(cfg, tmp_path):
    text = V13.read_text()
    for bad, match in ((text.replace("measure_users = 96", "measure_users = 12"), "measure_users 12 < users"),
                       (text.replace("baseline = true", "baseline = false"), "measure_users and measure_interactions"),
                       (text.replace("ab_share = 0.5", "ab_share = 1.0"), "protocol.guard")):
        p = tmp_path / "p.toml"
        p.write_text(bad)
        with pytest.raises(ValueError, match=match):
            load_protocol(p)
