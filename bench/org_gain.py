"""Does an org adapter beat the shared policy on its organisation's tasks? Prints a markdown table.

    .venv/bin/rtrl init                                            # champion = SmolLM2-135M-Instruct
    .venv/bin/python bench/org_gain.py --users 12 --interactions 240 --orgs org-acme org-globex
    RTRL_PROFILE=tiny .venv/bin/python bench/org_gain.py --interactions 40   # the plumbing, in minutes

Steps: the simulated users of cfg.simulate.orgs (each org with its own conventions, lab/simulate/personas.py)
drive the gateway serving the champion; the window is harvested; for each org with enough episodes its
adapter is trained (LoRA on the champion, that org's episodes only) and evaluated paired against the champion
on the org's own tasks (rl_core/orgs/tasks.py) and on the shared suite (evals.compare).
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import timedelta

from lab.simulate.runner import SimSpec, simulate
from rl_core.config import load_config
from rl_core.harvest import harvest
from rl_core.lake import Lake
from rl_core.orgs.pipeline import OrgRun, eligible_orgs, evaluate_org, prepare_org, train_org
from rl_core.registry import store
from rl_core.schema import now_utc
from rl_core.serving.server import serve_in_thread


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=None)
    ap.add_argument("--interactions", type=int, default=None)
    ap.add_argument("--orgs", nargs="*", default=None, help="only these orgs (default: every eligible org)")
    ap.add_argument("--min-episodes", type=int, default=None, help="default: gates.min_episodes")
    args = ap.parse_args(argv)
    cfg = load_config()
    champion = store.version_for_alias(cfg, "champion")
    if champion is None:
        print("no champion: run `rtrl init` first", file=sys.stderr)
        return 2
    t0 = time.time()
    spec = SimSpec.from_config(cfg, users=args.users, interactions=args.interactions)
    start = now_utc().replace(minute=0, second=0, microsecond=0)
    with serve_in_thread(cfg, port=0) as url:  # closing it compacts every acknowledged event into the lake
        report = simulate(cfg, url, spec, progress=False)
    end = now_utc() + timedelta(seconds=1)
    run_id = f"orggain-{start:%Y%m%dT%H%M%S}"
    harvest(cfg, start, end, champion, run_id)
    orgs = eligible_orgs(cfg, run_id, args.min_episodes)
    rows = []
    for org, n in orgs.items():
        if args.orgs and org not in args.orgs:
            continue
        o = OrgRun.of(cfg, start, end, champion, run_id, org)
        prepare_org(cfg, o)
        s = train_org(cfg, o)
        ev = evaluate_org(cfg, o)
        rows.append((org, n, s, ev))
    print(f"measured on: {cfg.profile} profile, champion v{champion}, {report.interactions} simulated interactions, "
          f"{time.time() - t0:.0f} s\n")
    print("| org | episodes | train steps | KL max | org tasks | org pass: champion -> adapter | paired diff (SE) "
          "| 95% CI | shared suite diff (SE) | verdicts eval / eval_org |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for org, n, s, ev in rows:
        lo, hi = ev.org_gain - 1.96 * ev.org_gain_se, ev.org_gain + 1.96 * ev.org_gain_se
        d = Lake(cfg.lake_root).read_json(Lake.run(ev.run_id).verdict("eval_org"))["details"]
        print(f"| {org} | {n} | {s.steps} | {s.kl_max if s.kl_max is not None else float('nan'):.4f} | {ev.org_n} "
              f"| {d['baseline_pass_rate']:.3f} -> {d['candidate_pass_rate']:.3f} | {ev.org_gain:+.3f} "
              f"({ev.org_gain_se:.3f}) | [{lo:+.3f}, {hi:+.3f}] | {ev.shared_diff:+.3f} ({ev.shared_se:.3f}) "
              f"| {'pass' if ev.shared_passed else 'FAIL'} / {'pass' if ev.org_passed else 'FAIL'} |")
    if not rows:
        print(f"| (no org with enough episodes: {orgs}) | | | | | | | | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
