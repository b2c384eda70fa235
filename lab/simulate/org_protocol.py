"""The organisations protocol's test: do the org adapters move each org's feature toward its own convention?

Why a difference in differences: org A's users reward a feature, org B's users penalise it. Each org's
adapter is trained on its own users' episodes only, so A's rate should rise and B's fall. A shared drift
(sampling, the day's tasks) moves both; the difference between the two orgs' moves cancels it. Per user:
d = (feature rate in the last cycle) - (in the first); DiD = mean d of the users whose org wants the feature
minus mean d of those whose org rejects it, with a Welch 95% interval (the two groups are different users).
The lake's interactions also say which adapter answered whom: neither org may be served the other's.
"""

from __future__ import annotations

import math
from datetime import datetime

from lab.simulate.experiment import CycleMetrics, t_interval
from lab.simulate.replay import Answer
from rl_core.config import Config
from rl_core.lake import Lake
from rl_core.orgs.pipeline import org_run_id
from rl_core.reports import read_verdicts


def welch(a: list[float], b: list[float]) -> dict | None:
    """mean(a) - mean(b) with a Welch t 95% interval; None when a group has fewer than 2 users."""
    from scipy import stats

    if len(a) < 2 or len(b) < 2:
        return None
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    va = sum((x - ma) ** 2 for x in a) / (len(a) - 1) / len(a)
    vb = sum((x - mb) ** 2 for x in b) / (len(b) - 1) / len(b)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / ((va**2 / (len(a) - 1)) + (vb**2 / (len(b) - 1))) if va + vb > 0 else len(a) + len(b) - 2
    t = float(stats.t.ppf(0.975, df))
    return {"diff": ma - mb, "se": se, "ci_low": ma - mb - t * se, "ci_high": ma - mb + t * se,
            "n_a": len(a), "n_b": len(b), "mean_a": ma, "mean_b": mb, "df": df}


def arm_effects(diffs: dict[str, list[float]] | dict[str, dict[str, list[float]]]) -> dict[str, dict | None]:
    """org -> the within-org effect of its adapter with a control arm: Welch of the adapter arm's per-user changes
    against the base arm's (each user's change: measured cycle - baseline). diffs: org -> arm -> changes."""
    return {o: welch(by.get("adapter", []), by.get("base", [])) for o, by in diffs.items()}


def did_of_effects(want: dict | None, reject: dict | None) -> dict | None:
    """The DiD with a control arm in each org: the wanting org's within-org effect minus the rejecting org's. The
    four arms are different users, so SE = sqrt(SE_want^2 + SE_reject^2), with a Welch-Satterthwaite t on the two
    effects' degrees of freedom. Keys as welch's: n_a, n_b = the two orgs' users in both arms, mean_a, mean_b = their
    effects. None when either effect is (an arm with fewer than 2 users)."""
    from scipy import stats

    if want is None or reject is None:
        return None
    va, vb = want["se"] ** 2, reject["se"] ** 2
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / want["df"] + vb**2 / reject["df"]) if va + vb > 0 else want["df"] + reject["df"]
    t = float(stats.t.ppf(0.975, df))
    diff = want["diff"] - reject["diff"]
    return {"diff": diff, "se": se, "ci_low": diff - t * se, "ci_high": diff + t * se, "df": df,
            "n_a": want["n_a"] + want["n_b"], "n_b": reject["n_a"] + reject["n_b"], "mean_a": want["diff"],
            "mean_b": reject["diff"], "control_arm": True}


def random_effects(estimates: list[float], ses: list[float]) -> dict | None:
    """The seeds' estimates pooled with the seed as a random effect: DerSimonian-Laird's between-seed variance tau^2,
    and a Hartung-Knapp 95% interval on k-1 degrees of freedom (its scale never below 1, so it is never narrower
    than the fixed-effect one). Why: pooling every seed's users as one sample treats seeds as exchangeable, but each
    seed trains its own adapters, so seeds differ by more than their users' noise (the six seeds of v10's training
    ran from +0.02 to +0.35); with few seeds only the t on k-1 df is honest. None with fewer than 2 seeds."""
    from scipy import stats

    k = len(estimates)
    if k < 2 or len(ses) != k or any(se is None or se <= 0 for se in ses):
        return None
    w0 = [1 / se**2 for se in ses]
    fixed = sum(w * y for w, y in zip(w0, estimates, strict=True)) / sum(w0)
    q = sum(w * (y - fixed) ** 2 for w, y in zip(w0, estimates, strict=True))
    tau2 = max(0.0, (q - (k - 1)) / (sum(w0) - sum(w * w for w in w0) / sum(w0)))
    w = [1 / (se**2 + tau2) for se in ses]
    mu = sum(wi * y for wi, y in zip(w, estimates, strict=True)) / sum(w)
    scale = max(1.0, sum(wi * (y - mu) ** 2 for wi, y in zip(w, estimates, strict=True)) / (k - 1))
    se = math.sqrt(scale / sum(w))
    t = float(stats.t.ppf(0.975, k - 1))
    return {"diff": mu, "se": se, "ci_low": mu - t * se, "ci_high": mu + t * se, "tau": math.sqrt(tau2),
            "seeds": k, "q": q}


def _org_of(user_id: str, orgs: list[str]) -> str | None:
    return next((o for o in orgs if user_id.startswith(f"{o}-")), None)  # make_users: "<org>-u<k>"


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def adapters_served(cfg: Config, curves: list[CycleMetrics]) -> dict[str, dict[str, int]]:
    """org -> {adapter_version or "none": interactions} in the last cycle's window, from the lake."""
    last = curves[-1]
    t = Lake(cfg.lake_root).read_window("interactions", datetime.fromisoformat(last.window[0]),
                                        datetime.fromisoformat(last.window[1]))
    out: dict[str, dict[str, int]] = {}
    if t is None:
        return out
    for org, adapter in zip(t.column("org_id").to_pylist(), t.column("adapter_version").to_pylist(), strict=True):
        by = out.setdefault(org, {})
        by[adapter or "none"] = by.get(adapter or "none", 0) + 1
    return out


SHAPE = ("code_block", "writes_code", "short_answer")  # complete blocks, any code, under 40 words


def org_verdicts(cfg: Config, trained: list[CycleMetrics]) -> dict[str, dict[str, bool]]:
    """org -> its adapter run's verdicts (data gates, train, eval on the shared suite, eval_org, monitors),
    over the cycles that trained adapters."""
    lake = Lake(cfg.lake_root)
    return {org: {name: v.passed for c in trained
                  for name, v in read_verdicts(lake, org_run_id(c.run_id, org)).items()}
            for org in cfg.simulate.conventions}


def org_summary(cfg: Config, feature: str, curves: list[CycleMetrics]) -> dict:
    """The DiD, each org's own move toward its convention, and the isolation and eval checks."""
    conv = cfg.simulate.conventions
    orgs = sorted(conv)
    first, last = curves[0].user_features.get(feature, {}), curves[-1].user_features.get(feature, {})
    d = {u: last[u] - first[u] for u in sorted(set(first) & set(last))}
    groups = {o: [x for u, x in d.items() if _org_of(u, orgs) == o] for o in orgs}
    want = [x for o in orgs if conv[o].want for x in groups[o]]
    reject = [x for o in orgs if not conv[o].want for x in groups[o]]
    moves = {o: {"want": conv[o].want, "users": len(groups[o]),
                 "mean_rate_change": sum(groups[o]) / len(groups[o]) if groups[o] else None} for o in orgs}
    served = adapters_served(cfg, curves)
    verdicts = org_verdicts(cfg, curves[:-1])
    did = welch(want, reject)
    isolated = all(a == "none" or a.startswith(f"{o}-") for o, by in served.items() for a in by)
    by_cycle = {o: [_mean([r for u, r in c.user_features.get(feature, {}).items() if _org_of(u, orgs) == o])
                    for c in curves] for o in orgs}  # each org's users' mean rate, per cycle (the plot)
    return {
        "did": did, "org_moves": moves, "org_rates_by_cycle": by_cycle, "adapters_served": served, "org_verdicts": verdicts,
        "user_rate_diffs": d,
        "checks": {
            **_did_checks(did, moves, verdicts),
            "adapters_isolated": isolated,
            "each_org_served_its_adapter": all(any(a != "none" for a in served.get(o, {})) for o in orgs),
        },
    }


def replay_summary(cfg: Config, feature: str, answers: list[Answer], trained: list[CycleMetrics],
                   base_version: int = 1, served_answers: list[Answer] | None = None,
                   guard: str | None = None, guard_tolerance: float = 0.05, guard_test: str = "point") -> dict:
    """The replay protocol's test (lab/simulate/replay.py). Per request: the adapter arm's feature rate
    minus the base arm's over its k samples each; per user: the mean over that user's requests (a user's
    requests share the user's tasks, so the user, not the request, is the independent unit); DiD: Welch over
    the users of the org that wants the feature against those of the org that rejects it. Plus each org's own
    move (a t interval over its users) and which weights answered each arm: in served_answers when given
    (requests through the gateway, whose headers say who answered), else in answers. guard: a feature no
    adapter may lose (each org's mean per-user change above -guard_tolerance), so that a convention is not met
    by dropping what it judges (no code block, no prose after it). Each org's guard also says whether it holds
    as a non-inferiority test (`noninferior`: the CI's lower bound above -guard_tolerance); guard_test
    "noninferiority" makes that the check (`guard_noninferior`), "point" (the old protocols') keeps `guard_kept`
    on the point estimate."""
    conv = cfg.simulate.conventions
    orgs = sorted(conv)
    arms = _hits(answers, feature)  # event_id -> arm -> feature hits over the samples
    owner = {a.event_id: (a.user_id, a.org_id) for a in answers}
    served: dict[str, dict[str, dict[str, int]]] = {}  # org -> arm -> adapter_version or "none" -> answers
    for a in answers if served_answers is None else served_answers:
        by = served.setdefault(a.org_id, {}).setdefault(a.arm, {})
        by[a.adapter_version or "none"] = by.get(a.adapter_version or "none", 0) + 1
    user_d = _user_changes(arms, owner)
    groups = {o: [d for u, d in user_d.items() if _org_of(u, orgs) == o] for o in orgs}
    rates = {o: {arm: _mean([h for eid, by in arms.items() if owner[eid][1] == o for h in by.get(arm, [])])
                 for arm in ("base", "adapter")} for o in orgs}
    moves = {o: {"want": conv[o].want, "users": len(groups[o]), "requests": sum(
                 1 for eid in arms if owner[eid][1] == o), **_interval(groups[o]),
                 "base_rate": rates[o]["base"], "adapter_rate": rates[o]["adapter"]} for o in orgs}
    did = welch([x for o in orgs if conv[o].want for x in groups[o]],
                [x for o in orgs if not conv[o].want for x in groups[o]])
    verdicts = org_verdicts(cfg, trained)
    own = {o: all(v.startswith(f"{o}-") for v in served.get(o, {}).get("adapter", {"none": 1})) for o in orgs}
    base_clean = all(set(by.get("base", {})) <= {"none"} for by in served.values())
    guards = {o: {"feature": guard, **iv, "tolerance": guard_tolerance,
                  "noninferior": iv["ci_low"] is not None and iv["ci_low"] > -guard_tolerance}
              for o, iv in _org_changes(answers, guard, owner, orgs).items()} if guard else {}
    shape = {f: _org_changes(answers, f, owner, orgs) for f in SHAPE if answers and f in answers[0].features}
    checked = answers if served_answers is None else served_answers
    wrong_version = sum(1 for a in checked if a.model_version != base_version)
    return {
        "did": did, "org_moves": moves, "adapters_served": served, "org_verdicts": verdicts,
        "org_rates_by_cycle": {o: [rates[o]["base"], rates[o]["adapter"]] for o in orgs},  # the plot: 1 base, 2 adapter
        "user_rate_diffs": user_d, "answers": len(answers), "served_checked": len(checked),
        "wrong_version": wrong_version,
        "checks": {
            **_did_checks(did, moves, verdicts),
            "gates_and_monitors_pass": bool(verdicts) and all(all(v.values()) for v in verdicts.values()),
            "adapters_isolated": all(own.values()) and base_clean and wrong_version == 0,
            "each_org_served_its_adapter": all(own.values()),
            **({"guard_kept": all(g["mean_rate_change"] is not None and g["mean_rate_change"] > -guard_tolerance
                                  for g in guards.values())} if guard and guard_test == "point" else {}),
            **({"guard_noninferior": all(g["noninferior"] for g in guards.values())}
               if guard and guard_test == "noninferiority" else {}),
        },
        **({"guard": guards} if guard else {}),
        "shape": shape,  # reported beside the test, not judged: how each adapter moved the answers' shape
    }


def pooled_orgs(summaries: list[dict], name: str, seeds: list[int], min_seeds_excluding_zero: int,
                pool: str = "users") -> dict:
    """The org test over several seeds: every seed's users together. Each user's change is the one its seed
    measured (its own adapters, its own v1 answers); the DiD is Welch over the users of the wanting org against
    those of the rejecting org, all seeds pooled, so the spread between seeds' adapters is in the groups'
    variances. pool "seeds_random" judges instead the seeds' own DiDs pooled with the seed as a random effect
    (random_effects; reported either way as `seed_random_effect`). Seeds measured live with a control arm in each org
    (org_live.py) pool their users arm by arm (_users_pool). Success: every registered seed present; the pooled CI
    above zero; at least min_seeds_excluding_zero seeds' own CIs above zero and no seed's CI entirely below zero;
    each org's pooled move toward its convention (which replaces the per-seed check: one seed's move can sit at
    zero); and every other check in every seed."""
    wants = {o: m["want"] for s in summaries for o, m in s["orgs"]["org_moves"].items()}
    users, moves = _users_pool(summaries, wants)
    per = [s["orgs"]["did"] for s in summaries if s["orgs"].get("did")]
    seed_re = random_effects([d["diff"] for d in per], [d["se"] for d in per]) if len(per) == len(summaries) else None
    did = seed_re if pool == "seeds_random" else users
    per_seed = ("did_excludes_zero", "each_org_moves_toward_its_convention")
    seeds_ok = sum(bool(s["checks"].get("did_excludes_zero")) for s in summaries)
    below = sum(bool(s["orgs"].get("did") and s["orgs"]["did"]["ci_high"] < 0) for s in summaries)
    toward = _toward(moves)
    others = all(v for s in summaries for k, v in s["checks"].items() if k not in per_seed)
    return {"protocol": name, "kind": "did", "seeds": [s["seed"] for s in summaries],
            "n_users": (users["n_a"] + users["n_b"]) if users else 0, "pool": pool,
            **{k: did[k] if did else None for k in ("diff", "se", "ci_low", "ci_high")}, "did": users,
            "seed_random_effect": seed_re, "org_moves": moves,
            "seeds_excluding_zero": seeds_ok, "seeds_below_zero": below,
            "each_org_moves_toward_its_convention": toward, "every_other_check_in_every_seed": others,
            "success": bool(sorted(s["seed"] for s in summaries) == sorted(seeds) and did and did["ci_low"] > 0
                            and seeds_ok >= min_seeds_excluding_zero and below == 0 and toward and others)}


def _users_pool(summaries: list[dict], wants: dict[str, bool]) -> tuple[dict | None, dict[str, dict]]:
    """Every seed's users together: the DiD and each org's move. Seeds measured with a control arm (a summary's
    `user_arms`, lab/simulate/org_live.py): each org's move is its adapter arm's mean change minus its base
    arm's (Welch) and the DiD is did_of_effects; otherwise each org's mean change and Welch across the orgs."""
    if summaries and all("user_arms" in s["orgs"] for s in summaries):
        by: dict[str, dict[str, list[float]]] = {o: {} for o in wants}
        for s in summaries:
            orgs, arms = sorted(s["orgs"]["org_moves"]), s["orgs"]["user_arms"]
            for u, d in s["orgs"]["user_rate_diffs"].items():
                by.setdefault(_org_of(u, orgs) or "?", {}).setdefault(arms[u], []).append(d)
        eff = arm_effects(by)
        want, reject = ([eff.get(o) for o, w in wants.items() if w is v] for v in (True, False))
        did = did_of_effects(want[0], reject[0]) if len(want) == len(reject) == 1 else None
        return did, {o: {"want": w, "users": sum(map(len, by.get(o, {}).values())),
                         **_effect(eff.get(o))} for o, w in wants.items()}
    diffs: dict[str, list[float]] = {}
    for s in summaries:
        orgs = sorted(s["orgs"]["org_moves"])
        for u, d in s["orgs"]["user_rate_diffs"].items():
            diffs.setdefault(_org_of(u, orgs) or "?", []).append(d)
    users = welch([x for o, w in wants.items() if w for x in diffs.get(o, [])],
                  [x for o, w in wants.items() if not w for x in diffs.get(o, [])])
    return users, {o: {"want": w, "users": len(diffs.get(o, [])), **_interval(diffs.get(o, []))}
                   for o, w in wants.items()}


def _effect(w: dict | None) -> dict:
    """A within-org effect (arm_effects) as an org's move: its diff as mean_rate_change, with its interval."""
    if w is None:
        return {"mean_rate_change": None, "se": None, "ci_low": None, "ci_high": None}
    return {"mean_rate_change": w["diff"], "se": w["se"], "ci_low": w["ci_low"], "ci_high": w["ci_high"],
            "adapter_arm": {"users": w["n_a"], "mean_change": w["mean_a"]},
            "base_arm": {"users": w["n_b"], "mean_change": w["mean_b"]}}


def _org_changes(answers: list[Answer], feature: str, owner: dict[str, tuple[str, str]],
                 orgs: list[str]) -> dict[str, dict]:
    """org -> the mean per-user change in feature (adapter arm - base arm) with its t 95% interval."""
    user = _user_changes(_hits(answers, feature), owner)
    return {o: _interval([d for u, d in user.items() if _org_of(u, orgs) == o]) for o in orgs}


def _hits(answers: list[Answer], feature: str) -> dict[str, dict[str, list[bool]]]:
    """event_id -> arm -> whether each of its samples has the feature."""
    hits: dict[str, dict[str, list[bool]]] = {}
    for a in answers:
        hits.setdefault(a.event_id, {}).setdefault(a.arm, []).append(a.features[feature])
    return hits


def _user_changes(arms: dict[str, dict[str, list[bool]]], owner: dict[str, tuple[str, str]]) -> dict[str, float]:
    """user -> the mean over the user's requests of (adapter arm's rate - base arm's rate) over the samples."""
    per_user: dict[str, list[float]] = {}
    for eid, hits in arms.items():
        if "base" in hits and "adapter" in hits:
            per_user.setdefault(owner[eid][0], []).append(_mean(hits["adapter"]) - _mean(hits["base"]))
    return {u: sum(x) / len(x) for u, x in sorted(per_user.items())}


def _did_checks(did: dict | None, moves: dict[str, dict], verdicts: dict[str, dict[str, bool]]) -> dict[str, bool]:
    """The checks both org tests share: the DiD's CI above zero, each org toward its own convention, and each
    adapter's shared-suite eval passed (no regression)."""
    return {
        "did_excludes_zero": bool(did and did["ci_low"] > 0),
        "each_org_moves_toward_its_convention": _toward(moves),
        "shared_suite_no_regression": bool(verdicts) and all(v.get("eval") for v in verdicts.values()),
    }


def _toward(moves: dict[str, dict]) -> bool:
    """Each org's mean change has its convention's sign (up where the org wants the feature, down where not)."""
    return all(m["mean_rate_change"] is not None and m["mean_rate_change"] * (1 if m["want"] else -1) > 0
               for m in moves.values())


def _interval(xs: list[float]) -> dict:
    """Mean with its t 95% interval over users (None when fewer than 2)."""
    if len(xs) < 2:
        return {"mean_rate_change": _mean(xs), "se": None, "ci_low": None, "ci_high": None}
    mean, se, lo, hi = t_interval(xs)
    return {"mean_rate_change": mean, "se": se, "ci_low": lo, "ci_high": hi}
