"""`rtrl experiment --protocol FILE`: a pre-registered learning experiment, run as written, reported whole.

Why a protocol file: a claim that the loop learns is only worth what its test is worth. Choosing the sizes,
the seeds or the metric after seeing runs (or running until one seed looks good) turns noise into results.
So the flags, sizes, seeds, config, the preferred feature, the primary metric and the success rule live in
one TOML file that is committed before the runs it reports; this module runs exactly that, one fresh
RTRL_HOME per seed, and writes a machine-readable summary per seed (the paired difference, its SE and 95% CI,
the feature rates per cycle, every gate's verdict, the A/B decision) that experiments/<question>/ keeps verbatim.

The test, per seed: users are seeded, so each user's mean reward under v1 (cycle 1) is paired with the same
user's under the last policy (last cycle); a paired t interval. Pooled: the seeds' per-user differences
together (different users per seed); for org protocols the DiD over every seed's users (org_protocol.pooled_orgs).
The final cycle only serves and is measured (`measure_last`): the monitors then judge it (production code,
judging only), and `rtrl ab` compares v1's logged traffic with the last policy's over the whole experiment.

What users would see (issue 43; every field defaults to what earlier protocols did, protocol_model.py): the
measured cycle can serve requests no update saw (held-out tasks of a named bank, new users; heldout.py), after a
baseline cycle in which v1 serves those same kinds of requests and nothing trains; users can rate sparsely and
noisily (raters.py); the primary test can be each user's rate of edits persisting; guards are non-inferiority
tests on the CI (outcomes.py). Every summary also keeps the raw per-request records of the first and the
measured cycle, each outcome's per-user paired test, `rtrl ab`'s A/B metrics beside the reward (ab_outcomes),
the design (which tasks and users were held out), each org adapter's KL and the phase times.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from lab.simulate import heldout, org_live, outcomes, replay
from lab.simulate.experiment import CycleMetrics, Paired, paired, run_experiment, t_interval
from lab.simulate.org_protocol import org_summary, pooled_orgs, replay_summary
from lab.simulate.personas import make_users, orgs_from_config
from lab.simulate.protocol_model import Protocol, env_of, load_protocol
from lab.simulate.protocol_plot import plot
from lab.simulate.protocol_report import log_pooled, log_summary, markdown
from rl_core.ab.verdict import ab_verdict, apply_verdict
from rl_core.config import REPO_ROOT, Config, load_config
from rl_core.registry import card
from rl_core.rewards.monitors import run_monitors
from rl_core.runtime.procs import environ

__all__ = ["Protocol", "env_of", "load_protocol", "log_pooled", "log_summary", "markdown", "plot", "pooled",
           "seed_summary", "run_protocol", "main"]


def _git_commit() -> str:
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                           capture_output=True, text=True).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")


def judge_last(cfg: Config, curves: list[CycleMetrics], ab_test: bool = True) -> dict:
    """The production checks on the measured last cycle: the monitors (v1 as the parent) over what it served,
    and `rtrl ab` over the whole experiment (v1's traffic as the champion arm, the last policy's as the
    challenger arm), applied: a promote moves `champion`. ab_test=False (org adapters: no new version)."""
    first, last = curves[0], curves[-1]
    mon = run_monitors(cfg, f"{last.run_id}-served", parent_version=1)
    card.log_monitors(cfg, mon)
    if not ab_test:
        return {"monitors": {"passed": mon.passed, "reasons": mon.reasons}, "ab": {"decision": "n/a"}}
    ab = ab_verdict(cfg, datetime.fromisoformat(first.window[0]), datetime.fromisoformat(last.window[1]))
    # a version the monitors tripped is never promoted, whatever the A/B says (the decision is still reported)
    action = apply_verdict(cfg, ab) if mon.passed else "not applied: the monitors tripped"
    return {"monitors": {"passed": mon.passed, "reasons": mon.reasons, "compared": mon.details.get("compared"),
                         "tripped": mon.details.get("tripped")},
            "ab": {"command": f"rtrl ab --since {first.window[0]} --until {last.window[1]} --apply",
                   "decision": ab.decision, "reasons": ab.reasons, "n": ab.n, "action": str(action),
                   "champion_version": ab.champion_version, "challenger_version": ab.challenger_version,
                   "metrics": {k: m.model_dump() for k, m in ab.metrics.items()}}}


def seed_summary(proto: Protocol, path: Path, seed: int, curves: list[CycleMetrics], judged: dict,
                 minutes: float, commit: str | None = None) -> dict:
    """Everything the success rule reads, for one seed. commit: the code the run started on (read before it:
    HEAD can move while a run of an hour goes on); None reads it now. Beside the registered test: what users
    saw (outcomes.outcome_summary: per-user paired tests of edits persisting, dissatisfied follow-ups, latency,
    the guards' non-inferiority), `rtrl ab`'s A/B metrics beside the reward, the raw per-request records of the
    first and the measured cycle, and each cycle's phase times."""
    first, last = curves[0], curves[-1]
    live = len(curves) > 1  # a replay protocol has one live cycle: its test is judged["orgs"]
    rewards = paired(first.user_reward, last.user_reward) if live else None
    fpair = paired(first.user_features.get(proto.feature, {}), last.user_features.get(proto.feature, {})) if live else None
    seen = outcomes.outcome_summary(first, last, proto.noninferior, proto.guard_tolerance) if live else None
    primary, diffs = _primary(proto, first, last) if live else (None, {})
    return {
        "protocol": proto.name, "protocol_file": str(path), "seed": seed, "minutes": round(minutes, 1),
        "protocol_sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "commit": commit or _git_commit(),
        "primary": _pair(primary), "primary_metric": proto.primary, "primary_user_diffs": diffs,
        "feature": proto.feature, "feature_rate_paired": _pair(fpair),
        "reward_paired": _pair(rewards),
        "user_diffs": {u: last.user_reward[u] - first.user_reward[u]
                       for u in sorted(set(first.user_reward) & set(last.user_reward))} if live else {},
        "cycles": [{"cycle": c.cycle, "role": c.role, "run_id": c.run_id, "dag_rc": c.dag_rc, "served": c.served,
                    "mean_reward": c.mean_reward, "episodes": c.episodes, "kl": c.kl, "new_version": c.new_version,
                    "verdicts": c.verdicts, "eval_pass_rate": c.eval_pass_rate, "no_edit_rate": c.no_edit_rate,
                    "edit_persisted_rate": c.edit_persisted_rate, "seconds": c.seconds, "window": c.window,
                    "feature_rates": c.feature_rates, "reward_ci": _mean_ci(list(c.user_reward.values()))}
                   for c in curves],
        "outcomes": seen, "ab_outcomes": outcomes.ab_view(judged.get("ab") or {}),
        "requests": {"first": first.requests, **({"last": last.requests} if live else {})},
        **judged,
        "checks": _checks(proto, curves, judged, primary, fpair, seen, minutes),
    }


def _primary(proto: Protocol, first: CycleMetrics, last: CycleMetrics) -> tuple[Paired | None, dict[str, float]]:
    """The registered paired test and its per-user differences (pooled over seeds): each user's mean reward, or
    each user's rate of edits persisting, or each user's rate of answers with the protocol's feature (measured
    cycle - first)."""
    if proto.primary in ("edit_persisted_rate", "feature_rate"):
        metric = proto.feature if proto.primary == "feature_rate" else proto.primary
        a, b = (outcomes.user_rates(c.requests, metric) for c in (first, last))
    else:
        a, b = first.user_reward, last.user_reward
    return paired(a, b), {u: b[u] - a[u] for u in sorted(set(a) & set(b))}


def _checks(proto: Protocol, curves: list[CycleMetrics], judged: dict, pair: Paired | None, fpair: Paired | None,
            seen: dict | None, minutes: float) -> dict[str, bool]:
    """Every check the success rule reads. The paired feature's rise is one only where the primary is the reward
    (the feature is why it should rise); each `noninferior` guard is one, judged on its CI's bound."""
    evals = {c.cycle: c.verdicts.get("eval") for c in curves if "eval" in c.verdicts}
    dags = {"every_dag_ok": all(c.dag_rc == 0 for c in curves)}
    if proto.dag == "cycle":
        checks = {"ci_excludes_zero": bool(pair and pair.ci_low > 0),
                  **({"feature_rises": bool(fpair and fpair.ci_low > 0)} if proto.primary == "mean_reward" else {}),
                  "eval_no_regression": bool(evals) and all(evals.values()), **dags,
                  "monitors_pass": judged["monitors"]["passed"], "ab_promotes": judged["ab"]["decision"] == "promote"}
    else:
        checks = {**dags, **judged["orgs"]["checks"]}
    guards = (seen or {}).get("guards", {})
    checks |= {f"noninferior_{g}": bool(guards.get(g, {}).get("noninferior")) for g in proto.noninferior}
    return checks | ({"within_minutes": minutes <= proto.max_minutes} if proto.max_minutes else {})


def _pair(p: Paired | None) -> dict | None:
    return None if p is None else {**p.__dict__, "excludes_zero": p.excludes_zero}


def _mean_ci(xs: list[float]) -> list[float] | None:
    """Mean of per-user values with a normal 95% interval (for the plot's error bars)."""
    if len(xs) < 2:
        return None
    m = sum(xs) / len(xs)
    se = (sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs)) ** 0.5
    return [m - 1.96 * se, m + 1.96 * se]


def pooled(summaries: list[dict], proto: Protocol) -> dict:
    """The success rule over all seeds: per-seed CIs, and the pooled paired CI of every seed's users."""
    d = [x for s in summaries for x in s.get("primary_user_diffs", s["user_diffs"]).values()]
    n = len(d)
    mean, se, lo, hi = t_interval(d)
    seeds_ok = sum(bool(s["primary"] and s["primary"]["ci_low"] > 0) for s in summaries)
    seeds_below = sum(bool(s["primary"] and s["primary"]["ci_high"] < 0) for s in summaries)
    out = {"protocol": proto.name, "seeds": [s["seed"] for s in summaries], "n_users": n, "diff": mean, "se": se,
           "ci_low": lo, "ci_high": hi, "seeds_excluding_zero": seeds_ok, "seeds_below_zero": seeds_below}
    out["success"] = bool(len(summaries) == len(proto.seeds) and seeds_ok >= proto.min_seeds_excluding_zero
                          and seeds_below == 0 and out["ci_low"] > 0
                          and all(s["checks"][k] for s in summaries for k in s["checks"] if k != "ci_excludes_zero"))
    return out


def _pool(summaries: list[dict], proto: Protocol) -> dict | None:
    """The rule over the seeds found: the paired test (cycle) or the pooled DiD (orgs); None with no users."""
    if proto.dag == "orgs":
        users = sum(len(s["orgs"]["user_rate_diffs"]) for s in summaries if s.get("orgs"))
        pool = pooled_orgs(summaries, proto.name, proto.seeds, proto.min_seeds_excluding_zero,
                           proto.pool) if users > 3 else None
        live = pool and all("org_ab" in s["orgs"] for s in summaries)  # a control arm: guards over every seed
        return org_live.pooled_live(pool, summaries, proto.guard, proto.guard_tolerance) if live else pool
    users = sum(len(s.get("primary_user_diffs", s["user_diffs"])) for s in summaries)
    return pooled(summaries, proto) if users > 1 else None


def run_seed(proto: Protocol, path: Path, seed: int, home: Path, out: Path) -> dict:
    """One seed's run in its own RTRL_HOME, as the protocol says; writes summary-seed<k>.json. The summary also
    records the held-out design (which tasks and users the update never saw), each org adapter's KL, and the
    phase times (the cycles', judging's, the per-org A/B's, the replay's). An orgs protocol measured live with
    `[orgs] ab_share` < 1 is judged with a control arm in each org (org_live.py)."""
    with environ(env_of(proto, seed) | {"RTRL_HOME": str(home)}):
        cfg = load_config()
        t0, commit = time.time(), _git_commit()
        dag_id = f"{cfg.airflow.dag_id}_orgs" if proto.dag == "orgs" else None
        plans, design = _plans(cfg, proto, seed)
        if proto.measure == "replay":
            curves, judged = _replayed(cfg, proto, seed, out / f"seed-{seed}", dag_id)
            phases = judged.pop("phases")
        else:
            curves, _, _ = run_experiment(cfg, len(plans), proto.interactions, out / f"seed-{seed}",
                                          proto.train_from, measure_last=proto.measure_last, dag_id=dag_id,
                                          plans=plans)
            t1 = time.time()
            judged = judge_last(cfg, curves, ab_test=proto.dag == "cycle")
            phases = {"experiment_s": round(t1 - t0, 1), "judge_s": round(time.time() - t1, 1)}
        if proto.dag == "orgs" and proto.measure == "live" and cfg.orgs.ab_share < 1:  # a control arm in each org
            t1 = time.time()
            judged["orgs"] = org_live.live_summary(cfg, proto.feature, curves, proto.guard, proto.guard_tolerance)
            phases["org_ab_s"] = round(time.time() - t1, 1)
        elif proto.dag == "orgs" and proto.measure == "live":
            judged["orgs"] = org_summary(cfg, proto.feature, curves)
        if proto.dag == "orgs":
            judged["adapter_kl"] = outcomes.adapter_kl(cfg, curves)
        judged |= {"design": design, "phases": phases | {"cycles": {c.cycle: c.seconds for c in curves}}}
        summary = seed_summary(proto, path, seed, curves, judged, (time.time() - t0) / 60, commit)
        log_summary(cfg, summary)
    (out / f"summary-seed{seed}.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    return summary


def _plans(cfg: Config, proto: Protocol, seed: int) -> tuple[list[heldout.CyclePlan], dict]:
    """Each cycle's plan (a replay protocol's one live cycle: the plain one) and the design the summary records,
    with the users held out (new users: the ids the measured cycle serves; measure_users beyond users: the
    measured cycles' users the trained cycle never had)."""
    cycles = proto.cycles - 1 if proto.measure == "replay" else proto.cycles
    plans, design = heldout.plans(proto.design, cycles, proto.measure_last, seed, cfg.simulate.tasks)
    orgs, measured = orgs_from_config(cfg), proto.measure_users or proto.users
    users = (heldout.new_users(measured, orgs, seed) if proto.new_users
             else make_users(measured, orgs, seed)[proto.users:])
    return plans, design | {"heldout_users": [u.user_id for u in users]}


def _replayed(cfg: Config, proto: Protocol, seed: int, out: Path, dag_id: str | None) -> tuple[list, dict]:
    """Cycle 1 live (the org DAG trains the adapters on it), then its requests replayed to v1 and to each org's
    adapter; the monitors are the ones the org path already ran on each adapter (rl_core/pipeline.py)."""
    t0 = time.time()
    curves, _, _ = run_experiment(cfg, proto.cycles - 1, proto.interactions, out, proto.train_from, dag_id=dag_id)
    t1 = time.time()
    first = curves[0]
    reqs = replay.logged_requests(cfg, datetime.fromisoformat(first.window[0]), datetime.fromisoformat(first.window[1]),
                                  sorted(cfg.simulate.conventions))
    answers = replay.sample(cfg, reqs, 1, proto.replay_samples, seed)
    replay.save(answers, out / "replay.jsonl")
    # what the gateway serves each org: each user's first request, through it, to `auto` with the org's token
    firsts = list({r.user_id: r for r in reversed(reqs)}.values())
    served = replay.replay(cfg, firsts, 1, 1, seed, out / "replay-gateway.log", arms=("adapter",))
    replay.save(served, out / "replay-served.jsonl")
    orgs = replay_summary(cfg, proto.feature, answers, curves, served_answers=served, guard=proto.guard,
                          guard_tolerance=proto.guard_tolerance, guard_test=proto.guard_test)
    mon = {o: v.get("monitors", False) for o, v in orgs["org_verdicts"].items()}
    return curves, {"monitors": {"passed": bool(mon) and all(mon.values()), "reasons": [
                        f"{o}: the adapter's monitors failed" for o, ok in mon.items() if not ok]},
                    "ab": {"decision": "n/a"}, "orgs": orgs, "replay": {"requests": len(reqs),
                                                                          "samples": proto.replay_samples},
                    "phases": {"experiment_s": round(t1 - t0, 1), "replay_s": round(time.time() - t1, 1)}}


def run_protocol(path: Path, seeds: list[int] | None, home: Path | None, out: Path) -> list[dict]:
    proto = load_protocol(path)
    todo = seeds or proto.seeds
    unknown = sorted(set(todo) - set(proto.seeds))
    if unknown:
        raise ValueError(f"--seed {unknown}: not in the protocol's seeds {proto.seeds}")
    out.mkdir(parents=True, exist_ok=True)
    root = home or Path(os.environ.get("RTRL_HOME", "var")) / "protocols" / proto.name
    done = []
    for seed in todo:
        print(f"[protocol] {proto.name}: seed {seed} (RTRL_HOME {root / f'seed-{seed}'})", file=sys.stderr)
        for folder in (root / f"seed-{seed}", out / f"seed-{seed}"):
            if (moved := set_aside(folder)) is not None:
                print(f"[protocol] {folder} held an earlier start of this seed: moved to {moved}; "
                      "the seed runs from an empty home", file=sys.stderr)
        done.append(run_seed(proto, path, seed, root / f"seed-{seed}", out))
    return done


def set_aside(folder: Path) -> Path | None:
    """A seed runs from an empty home: an earlier (aborted) start's lake, WAL and registry would otherwise join
    its windows. The old folder is renamed beside it, not deleted (the history reports every start)."""
    if not folder.exists() or not any(folder.iterdir()):
        return None
    moved = folder.with_name(f"{folder.name}.aborted-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}")
    folder.rename(moved)
    return moved


def main(path: Path, seeds: list[int] | None, home: Path | None, out: Path | None, run: bool = True) -> int:
    """`rtrl experiment --protocol FILE [--seed K ...]`: run the seeds, then summarise every seed found in out
    (run=False, `--report`: only summarise what is there)."""
    proto = load_protocol(path)
    out = out or Path(os.environ.get("RTRL_HOME", "var")) / "protocols" / proto.name / "out"
    if run:
        run_protocol(path, seeds, home, out)
    summaries = [json.loads((out / f"summary-seed{k}.json").read_text()) for k in proto.seeds
                 if (out / f"summary-seed{k}.json").exists()]
    pool = _pool(summaries, proto)
    if pool:
        (out / "pooled.json").write_text(json.dumps(pool, indent=1))
        log_pooled(load_config(), pool)
    # the preferred feature, then every other feature the base shows in 15-85% of answers (side effects)
    base = summaries[0]["cycles"][0]["feature_rates"] if summaries else {}
    features = [proto.feature] + [f for f, r in base.items() if f != proto.feature and 0.15 <= r["rate"] <= 0.85]
    png = plot(summaries, features, out / "learning_curves.png", proto.guard_tolerance)
    md = markdown(summaries, pool)
    (out / "results.md").write_text(md)
    print(md + f"\nsummaries and plot: {out} ({png.name})")
    return 0 if all(s["checks"]["every_dag_ok"] for s in summaries) else 1
