"""What a protocol's runs leave where people look: the results table (results.md) and the MLflow runs of each
seed's test and of the rule over the seeds. Read from the summaries alone, so `--report` rewrites them."""

from __future__ import annotations

from rl_core.config import Config
from rl_core.ids import mlflow_filter_value
from rl_core.registry import store


def log_summary(cfg: Config, summary: dict) -> str:
    """The seed's test where operators compare runs: an MLflow run `protocol-<name>-seed<k>` in the `learning`
    experiment, the test's numbers as metrics grouped `protocol/*` (the paired difference, the feature's; for org
    protocols the DiD, each org's move and guard; the per-user paired test of every outcome users saw,
    `protocol/outcome/<metric>/*`, where the summary has them), each registered check as a tag `check.<name>` with
    `all_checks_pass` (the seed's; a rule over several seeds also needs pooled.json), and the summary JSON itself.
    Returns the run id."""
    orgs = summary.get("orgs") or {}
    groups = {"primary": summary.get("primary"), "feature": summary.get("feature_rate_paired"),
              "did": orgs.get("did"), **{f"org/{o}": m for o, m in (orgs.get("org_moves") or {}).items()},
              **{f"guard/{o}": g for o, g in (orgs.get("guard") or {}).items()},
              **{f"outcome/{m}": p for m, p in ((summary.get("outcomes") or {}).get("paired") or {}).items()},
              **{f"org_ab/{o}/{m}": d for o, v in (orgs.get("org_ab") or {}).items()
                 for m, d in v["metrics"].items()}}
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


# how a summary's primary metric (its paired per-user test) is named in tables (bench/claims.py too)
PRIMARY_LABELS = {"mean_reward": "reward", "feature_rate": "feature rate", "edit_persisted_rate": "edits persisted"}


def markdown(summaries: list[dict], pool: dict | None) -> str:
    """One row per seed (the registered test and every check), then the pooled line."""
    f = "{:+.3f}".format
    what = {s.get("primary_metric", "mean_reward") for s in summaries} - {"mean_reward"}
    label = PRIMARY_LABELS.get(next(iter(what)), "reward") if len(what) == 1 else "reward"  # the per-user mean
    lines = [f"| seed | users | v1 {label} | last {label} | paired diff | 95% CI | feature rate first -> last | "
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
    lines += [line for s in summaries for line in _org_live_lines(s)]
    if pool and pool.get("kind") == "did" and not pool["did"]:
        lines += ["", f"pooled DiD over seeds {pool['seeds']}: n/a (an org has fewer than 2 users); success: False"]
    elif pool and pool.get("kind") == "did" and pool.get("pool") == "seeds_random":
        re_ = pool["seed_random_effect"]
        est = (f"{f(re_['diff'])} (SE {re_['se']:.3f}, Hartung-Knapp 95% CI [{f(re_['ci_low'])}, {f(re_['ci_high'])}] "
               f"on {re_['seeds'] - 1} df, between-seed SD {re_['tau']:.3f})") if re_ else "n/a (fewer than 2 seeds)"
        lines += ["", f"pooled DiD, the seed a random effect, over seeds {pool['seeds']}: {est}; "
                      f"{pool['seeds_excluding_zero']} seed(s) exclude zero, {pool.get('seeds_below_zero', 0)} "
                      f"entirely below; every other check in every seed: "
                      f"{pool['every_other_check_in_every_seed']}; success: {pool['success']}"]
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
    if pool and pool.get("guards"):
        g = pool["guards"]
        lines.append("guards over every seed's users (adapter arm - base arm): " + "; ".join(
            [f"{o} {x['feature']} {_iv(x)}" for o, x in g["guard"].items()]
            + [f"{o} dissatisfied_rate {_iv(x)}" for o, x in g["dissatisfied_rate"].items()]
            + [f"A/B rollbacks per org {g['org_ab_rollbacks']}"]) + f"; {g['checks']}")
    return "\n".join(lines) + "\n"


def _iv(x: dict) -> str:
    if x.get("ci_low") is None:
        return "n/a"
    mean = x.get("mean_rate_change", x.get("diff"))
    return f"{mean:+.3f} [{x['ci_low']:+.3f}, {x['ci_high']:+.3f}] (non-inferior: {x['noninferior']})"


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


def _org_live_lines(s: dict) -> list[str]:
    """A seed measured live with a control arm in each org (org_live.py): each org's effect (adapter arm - base arm
    of the per-user change), its guard, and its `rtrl ab --org` verdict with every metric's difference and CI."""
    o = s.get("orgs") or {}
    if "org_ab" not in o:
        return []
    f, d = "{:+.3f}".format, o["did"]

    def ci(x: dict) -> str:
        return f"[{f(x['ci_low'])}, {f(x['ci_high'])}]" if x.get("ci_low") is not None else "n/a"

    lines = ["", f"seed {s['seed']}, live with a control arm (ab_share {o['ab_share']}): DiD "
                 + (f"{f(d['diff'])} (SE {d['se']:.3f}, 95% CI {ci(d)})" if d else "n/a")
                 + f"; arms served as assigned: {o['checks']['arms_served_as_assigned']}"]
    for org, m in o["org_moves"].items():
        arms = ", ".join(f"{a} {m[f'{a}_arm']['users']} users {f(m[f'{a}_arm']['mean_change'])}"
                         for a in ("adapter", "base") if m[f"{a}_arm"]["mean_change"] is not None)
        g = (o.get("guard") or {}).get(org)
        ab = o["org_ab"][org]
        metrics = "; ".join(f"{k} {f(v['diff'])} [{f(v['lo'])}, {f(v['hi'])}]" for k, v in ab["metrics"].items())
        lines.append(f"- {org} ({'wants' if m['want'] else 'rejects'} {s['feature']}): adapter arm - base arm "
                     + (f"{f(m['mean_rate_change'])} {ci(m)}" if m["mean_rate_change"] is not None else "n/a")
                     + f" ({arms})"
                     + (f"; guard {g['feature']} {f(g['mean_rate_change']) if g['mean_rate_change'] is not None else 'n/a'}"
                        f" {ci(g)}, non-inferior at -{g['tolerance']}: {g['noninferior']}" if g else "")
                     + f"; `{ab['command']}`: {ab['decision']}, n {ab['n']}" + (f"; {metrics}" if metrics else ""))
    return lines
