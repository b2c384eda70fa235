"""`rtrl experiment --protocol FILE`: a pre-registered learning experiment, run as written, reported whole.

Why a protocol file: a claim that the loop learns is only worth what its test is worth. Choosing the sizes,
the seeds or the metric after seeing runs (or running until one seed looks good) turns noise into results.
So the flags, sizes, seeds, config, the preferred feature, the primary metric and the success rule live in
one TOML file that is committed before the runs it reports; this module runs exactly that, one fresh
RTRL_HOME per seed, and writes a machine-readable summary per seed (the paired difference, its SE and 95% CI,
the feature rates per cycle, every gate's verdict, the A/B decision) that docs/results/ keeps verbatim.

The test, per seed: users are seeded, so each user's mean reward under v1 (cycle 1) is paired with the same
user's under the last policy (last cycle); a paired t interval. Pooled: the seeds' per-user differences
together (different users per seed); for org protocols the DiD over every seed's users (org_protocol.pooled_orgs).
The final cycle only serves and is measured (`measure_last`): the monitors then judge it (production code,
judging only), and `rtrl ab` compares v1's logged traffic with the last policy's over the whole experiment.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import tomllib
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rl_core.ab.verdict import ab_verdict, apply_verdict
from rl_core.config import REPO_ROOT, Config, load_config
from rl_core.ids import mlflow_filter_value
from rl_core.registry import card, store
from rl_core.rewards.monitors import run_monitors
from rl_core.runtime.procs import environ
from rl_core.simulate import replay
from rl_core.simulate.experiment import CycleMetrics, Paired, paired, preferred_features, run_experiment, t_interval
from rl_core.simulate.features import FEATURES
from rl_core.simulate.org_protocol import org_summary, pooled_orgs, replay_summary
from rl_core.simulate.protocol_plot import plot


class Protocol(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    question: str
    registered: str  # the date it was written, before any run it reports
    seeds: list[int] = Field(min_length=1)
    cycles: int = Field(2, ge=2)
    interactions: int = Field(gt=0)
    users: int = Field(gt=1)
    challenger_share: float = Field(1.0, gt=0, le=1)
    train_from: Literal["champion", "latest"] = "latest"
    measure_last: bool = True
    dag: Literal["cycle", "orgs"] = "cycle"  # what trains between cycles: the policy, or the org adapters
    feature: str  # the preferred feature whose rate must move (checked against the config's preferences)
    choice: str = ""  # how the feature was chosen (from the census, before any update), in words
    primary: Literal["mean_reward", "feature_did", "replay_did"] = "mean_reward"  # the DiDs: rl_core/simulate/org_protocol.py
    # live: the last cycle is measured on live simulated traffic; replay (orgs only): instead of a last live
    # cycle, the trained cycle's requests are replayed to the base version and to each org's adapter,
    # replay_samples times each (rl_core/simulate/replay.py)
    measure: Literal["live", "replay"] = "live"
    replay_samples: int = Field(4, ge=1, le=32)
    guard: str | None = None  # replay: a feature no adapter may lose (each org's mean change above -guard_tolerance)
    guard_tolerance: float = Field(0.05, gt=0, le=1)
    success: str  # the rule, in words, as registered
    max_minutes: float | None = None  # each seed's run must end within this (a check: within_minutes)
    min_seeds_excluding_zero: int = Field(2, ge=0)  # orgs: see org_protocol.pooled_orgs
    config: dict[str, dict] = {}  # rtrl.toml sections -> keys: applied to every run as RTRL_<S>__<K>


def load_protocol(path: Path) -> Protocol:
    """The protocol at path, validated; its config overrides are validated by the Config model too."""
    try:
        proto = Protocol(**tomllib.loads(path.read_text())["protocol"])
    except (KeyError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path}: not a protocol file (a [protocol] table is needed): {exc}") from None
    cfg = load_config(environ={**os.environ, **env_of(proto, proto.seeds[0])})
    prefs = preferred_features(cfg)
    if proto.feature not in prefs:
        raise ValueError(f"{path}: protocol.feature {proto.feature!r} is not a preference of its config ({prefs})")
    wants = {p.want for p in cfg.simulate.conventions.values() if p.feature == proto.feature}
    if proto.dag == "orgs" and wants != {True, False}:
        raise ValueError(f"{path}: an orgs protocol needs one org that wants {proto.feature!r} and one that rejects it")
    if (proto.measure == "replay") != (proto.primary == "replay_did") or (
            proto.measure == "replay" and (proto.dag != "orgs" or proto.cycles != 2)):
        raise ValueError(f"{path}: protocol.measure = \"replay\" goes with primary = \"replay_did\", dag = \"orgs\" "
                         "and cycles = 2 (cycle 1 live and trained, cycle 2 the replay)")
    if proto.guard is not None and (proto.measure != "replay" or proto.guard not in FEATURES):
        raise ValueError(f"{path}: protocol.guard {proto.guard!r} needs measure = \"replay\" and a known answer "
                         f"feature ({', '.join(sorted(FEATURES))})")
    return proto


def env_of(proto: Protocol, seed: int) -> dict[str, str]:
    """The environment a seed's run is configured by (the config overrides, the seed, the experiment's sizes)."""
    env = {f"RTRL_{sec.upper()}__{key.upper()}": v if isinstance(v, str) else json.dumps(v)
           for sec, keys in proto.config.items() for key, v in keys.items()}
    return env | {"RTRL_SIMULATE__SEED": str(seed), "RTRL_SIMULATE__USERS": str(proto.users),
                  "RTRL_SERVING__CHALLENGER_SHARE": str(proto.challenger_share)}


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
    HEAD can move while a run of an hour goes on); None reads it now."""
    first, last = curves[0], curves[-1]
    live = len(curves) > 1  # a replay protocol has one live cycle: its test is judged["orgs"]
    pair = paired(first.user_reward, last.user_reward) if live else None
    fpair = paired(first.user_features.get(proto.feature, {}), last.user_features.get(proto.feature, {})) if live else None
    evals = {c.cycle: c.verdicts.get("eval") for c in curves if "eval" in c.verdicts}
    return {
        "protocol": proto.name, "protocol_file": str(path), "seed": seed, "minutes": round(minutes, 1),
        "protocol_sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "commit": commit or _git_commit(),
        "primary": _pair(pair), "feature": proto.feature, "feature_rate_paired": _pair(fpair),
        "user_diffs": {u: last.user_reward[u] - first.user_reward[u]
                       for u in sorted(set(first.user_reward) & set(last.user_reward))} if live else {},
        "cycles": [{"cycle": c.cycle, "run_id": c.run_id, "dag_rc": c.dag_rc, "served": c.served,
                    "mean_reward": c.mean_reward, "episodes": c.episodes, "kl": c.kl, "new_version": c.new_version,
                    "verdicts": c.verdicts, "eval_pass_rate": c.eval_pass_rate, "no_edit_rate": c.no_edit_rate,
                    "feature_rates": c.feature_rates, "reward_ci": _mean_ci(list(c.user_reward.values()))}
                   for c in curves],
        **judged,
        "checks": ({
            "ci_excludes_zero": bool(pair and pair.ci_low > 0),
            "feature_rises": bool(fpair and fpair.ci_low > 0),
            "eval_no_regression": bool(evals) and all(evals.values()),
            "every_dag_ok": all(c.dag_rc == 0 for c in curves),
            "monitors_pass": judged["monitors"]["passed"],
            "ab_promotes": judged["ab"]["decision"] == "promote",
        } if proto.dag == "cycle" else {"every_dag_ok": all(c.dag_rc == 0 for c in curves),
                                         **judged["orgs"]["checks"]})
        | ({"within_minutes": minutes <= proto.max_minutes} if proto.max_minutes else {}),
    }


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
    d = [x for s in summaries for x in s["user_diffs"].values()]
    n = len(d)
    mean, se, lo, hi = t_interval(d)
    seeds_ok = sum(bool(s["primary"] and s["primary"]["ci_low"] > 0) for s in summaries)
    out = {"protocol": proto.name, "seeds": [s["seed"] for s in summaries], "n_users": n, "diff": mean, "se": se,
           "ci_low": lo, "ci_high": hi, "seeds_excluding_zero": seeds_ok}
    out["success"] = bool(len(summaries) == len(proto.seeds) and seeds_ok >= proto.min_seeds_excluding_zero
                          and out["ci_low"] > 0
                          and all(s["checks"][k] for s in summaries for k in s["checks"] if k != "ci_excludes_zero"))
    return out


def _pool(summaries: list[dict], proto: Protocol) -> dict | None:
    """The rule over the seeds found: the paired test (cycle) or the pooled DiD (orgs); None with no users."""
    if proto.dag == "orgs":
        users = sum(len(s["orgs"]["user_rate_diffs"]) for s in summaries if s.get("orgs"))
        return pooled_orgs(summaries, proto.name, proto.seeds, proto.min_seeds_excluding_zero) if users > 3 else None
    return pooled(summaries, proto) if sum(len(s["user_diffs"]) for s in summaries) > 1 else None


def run_seed(proto: Protocol, path: Path, seed: int, home: Path, out: Path) -> dict:
    """One seed's run in its own RTRL_HOME, as the protocol says; writes summary-seed<k>.json."""
    with environ(env_of(proto, seed) | {"RTRL_HOME": str(home)}):
        cfg = load_config()
        t0, commit = time.time(), _git_commit()
        dag_id = f"{cfg.airflow.dag_id}_orgs" if proto.dag == "orgs" else None
        if proto.measure == "replay":
            curves, judged = _replayed(cfg, proto, seed, out / f"seed-{seed}", dag_id)
        else:
            curves, _, _ = run_experiment(cfg, proto.cycles, proto.interactions, out / f"seed-{seed}",
                                          proto.train_from, measure_last=proto.measure_last, dag_id=dag_id)
            judged = judge_last(cfg, curves, ab_test=proto.dag == "cycle")
        if proto.dag == "orgs" and proto.measure == "live":
            judged["orgs"] = org_summary(cfg, proto.feature, curves)
        summary = seed_summary(proto, path, seed, curves, judged, (time.time() - t0) / 60, commit)
        log_summary(cfg, summary)
    (out / f"summary-seed{seed}.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    return summary


def log_summary(cfg: Config, summary: dict) -> str:
    """The seed's test where operators compare runs: an MLflow run `protocol-<name>-seed<k>` in the `learning`
    experiment, the test's numbers as metrics grouped `protocol/*` (the paired difference, the feature's; for org
    protocols the DiD, each org's move and guard), each registered check as a tag `check.<name>` with
    `all_checks_pass` (the seed's; a rule over several seeds also needs pooled.json), and the summary JSON itself.
    Returns the run id."""
    orgs = summary.get("orgs") or {}
    groups = {"primary": summary.get("primary"), "feature": summary.get("feature_rate_paired"),
              "did": orgs.get("did"), **{f"org/{o}": m for o, m in (orgs.get("org_moves") or {}).items()},
              **{f"guard/{o}": g for o, g in (orgs.get("guard") or {}).items()}}
    metrics = {f"protocol/{g}/{k}": float(v) for g, d in groups.items() if d for k, v in d.items()
               if isinstance(v, int | float) and not isinstance(v, bool)}
    checks = summary["checks"]
    c = store.client(cfg)
    name = f"protocol-{summary['protocol']}-seed{summary['seed']}"
    run = c.create_run(store.experiment_id(cfg, "learning"), run_name=name,
                       tags={"kind": "protocol", "protocol": summary["protocol"], "seed": str(summary["seed"]),
                             "commit": summary["commit"], "protocol_sha256": summary["protocol_sha256"],
                             "all_checks_pass": str(all(checks.values())).lower(),
                             **{f"check.{k}": str(v).lower() for k, v in checks.items()}})
    for k, v in metrics.items():
        c.log_metric(run.info.run_id, k, v)
    c.log_dict(run.info.run_id, summary, f"summary-seed{summary['seed']}.json")
    c.set_terminated(run.info.run_id)
    return run.info.run_id


def log_pooled(cfg: Config, pool: dict) -> str:
    """The rule over the seeds where operators look: one MLflow run `protocol-<name>-pooled` in the `learning`
    experiment (the invoking RTRL_HOME's; each seed's own run is in its seed's home), the pooled numbers as metrics
    `protocol/pooled/*`, `success` and the seeds as tags, pooled.json itself. A rerun (`--report`) updates the
    same run rather than adding one. Returns the run id."""
    c, name = store.client(cfg), f"protocol-{pool['protocol']}-pooled"
    exp = store.experiment_id(cfg, "learning")
    old = c.search_runs([exp], f"tags.protocol_pooled = {mlflow_filter_value(pool['protocol'])}", max_results=1)
    run_id = old[0].info.run_id if old else c.create_run(exp, run_name=name, tags={
        "kind": "protocol", "protocol_pooled": pool["protocol"], "protocol": pool["protocol"]}).info.run_id
    for k, v in {"success": str(pool["success"]).lower(), "seeds": ",".join(map(str, pool["seeds"]))}.items():
        c.set_tag(run_id, k, v)
    for k in ("diff", "se", "ci_low", "ci_high", "n_users", "seeds_excluding_zero"):
        if isinstance(pool.get(k), int | float):
            c.log_metric(run_id, f"protocol/pooled/{k}", float(pool[k]))
    c.log_dict(run_id, pool, "pooled.json")
    c.set_terminated(run_id)
    return run_id


def _replayed(cfg: Config, proto: Protocol, seed: int, out: Path, dag_id: str | None) -> tuple[list, dict]:
    """Cycle 1 live (the org DAG trains the adapters on it), then its requests replayed to v1 and to each org's
    adapter; the monitors are the ones the org path already ran on each adapter (rl_core/pipeline.py)."""
    curves, _, _ = run_experiment(cfg, proto.cycles - 1, proto.interactions, out, proto.train_from, dag_id=dag_id)
    first = curves[0]
    reqs = replay.logged_requests(cfg, datetime.fromisoformat(first.window[0]), datetime.fromisoformat(first.window[1]),
                                  sorted(cfg.simulate.conventions))
    answers = replay.sample_batched(cfg, reqs, 1, proto.replay_samples, seed)
    replay.save(answers, out / "replay.jsonl")
    # what the gateway serves each org: each user's first request, through it, to `auto` with the org's token
    firsts = list({r.user_id: r for r in reversed(reqs)}.values())
    served = replay.replay(cfg, firsts, 1, 1, seed, out / "replay-gateway.log", arms=("adapter",))
    replay.save(served, out / "replay-served.jsonl")
    orgs = replay_summary(cfg, proto.feature, answers, curves, served_answers=served, guard=proto.guard,
                          guard_tolerance=proto.guard_tolerance)
    mon = {o: v.get("monitors", False) for o, v in orgs["org_verdicts"].items()}
    return curves, {"monitors": {"passed": bool(mon) and all(mon.values()), "reasons": [
                        f"{o}: the adapter's monitors failed" for o, ok in mon.items() if not ok]},
                    "ab": {"decision": "n/a"}, "orgs": orgs, "replay": {"requests": len(reqs),
                                                                          "samples": proto.replay_samples}}


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
        done.append(run_seed(proto, path, seed, root / f"seed-{seed}", out))
    return done


def markdown(summaries: list[dict], pool: dict | None) -> str:
    """One row per seed (the registered test and every check), then the pooled line."""
    f = "{:+.3f}".format
    lines = ["| seed | users | v1 reward | last reward | paired diff | 95% CI | feature rate first -> last | "
             "eval | monitors | A/B | minutes |", "|" + "---|" * 11]
    for s in summaries:
        p, first, last = s["primary"], s["cycles"][0], s["cycles"][-1]
        fr0, fr1 = first["feature_rates"][s["feature"]], last["feature_rates"][s["feature"]]
        ck = s["checks"]
        if "orgs" in s:
            lines.append(_org_row(s))
            continue
        lines.append(
            f"| {s['seed']} | {p['n_users'] if p else 0} | {f(p['first_mean']) if p else 'n/a'} | "
            f"{f(p['last_mean']) if p else 'n/a'} | {f(p['diff']) if p else 'n/a'} | "
            + (f"[{f(p['ci_low'])}, {f(p['ci_high'])}]" if p else "n/a")
            + f" | {fr0['rate']:.3f} -> {fr1['rate']:.3f} | {_eval(s)} | "
            f"{'pass' if ck['monitors_pass'] else 'TRIPPED'} | {s['ab']['decision']} | {s['minutes']} |")
    if pool and pool.get("kind") == "did" and not pool["did"]:
        lines += ["", f"pooled DiD over seeds {pool['seeds']}: n/a (an org has fewer than 2 users); success: False"]
    elif pool and pool.get("kind") == "did":
        moves = ", ".join(f"{o} {'+' if m['want'] else '-'}: {f(m['mean_rate_change'])}" for o, m in pool["org_moves"].items())
        lines += ["", f"pooled DiD over {pool['n_users']} users of seeds {pool['seeds']}: {f(pool['diff'])} "
                      f"(SE {pool['se']:.3f}, Welch 95% CI [{f(pool['ci_low'])}, {f(pool['ci_high'])}]); {moves}; "
                      f"{pool['seeds_excluding_zero']} seed(s) exclude zero; every other check in every seed: "
                      f"{pool['every_other_check_in_every_seed']}; success: {pool['success']}"]
    elif pool:
        lines += ["", f"pooled over {pool['n_users']} users of seeds {pool['seeds']}: {f(pool['diff'])} "
                      f"(SE {pool['se']:.3f}, 95% CI [{f(pool['ci_low'])}, {f(pool['ci_high'])}]); "
                      f"{pool['seeds_excluding_zero']} seed(s) exclude zero; success: {pool['success']}"]
    return "\n".join(lines) + "\n"


def _eval(s: dict) -> str:
    """The eval verdict of the update: ok, REGRESSION, or none when no update got that far."""
    if not any("eval" in c["verdicts"] for c in s["cycles"]):
        return "no eval (" + ", ".join(f"{k} failed" for c in s["cycles"] for k, v in c["verdicts"].items() if not v) + ")"
    return "ok" if s["checks"]["eval_no_regression"] else "REGRESSION"


def _org_row(s: dict) -> str:
    """An orgs-protocol seed in the same table: the DiD in the diff columns, each org's move in the feature's."""
    o, d = s["orgs"], s["orgs"]["did"]
    moves = ", ".join(f"{org} {'+' if m['want'] else '-'}: {m['mean_rate_change']:+.3f}"
                      for org, m in o["org_moves"].items() if m["mean_rate_change"] is not None)
    ci = f"[{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]" if d else "n/a"
    return (f"| {s['seed']} | {d['n_a'] + d['n_b'] if d else 0} | | | DiD {d['diff'] if d else float('nan'):+.3f} | {ci} "
            f"| {moves} | {'ok' if o['checks']['shared_suite_no_regression'] else 'REGRESSION'} | "
            f"{'isolated' if o['checks']['adapters_isolated'] else 'LEAK'} | {s['ab']['decision']} | {s['minutes']} |")


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
