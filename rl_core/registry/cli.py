"""`rtrl register | deploy | ab | promote | rollback | registry`: the registry stages by hand.

Each prints what it did and exits non-zero when it refused (a failed gate, nothing to promote), so a
shell script can chain them like the DAG does.
"""

from __future__ import annotations

import argparse
import re
import sys
from datetime import datetime, timedelta, timezone

from rl_core.config import load_config


def parse_time(value: str) -> datetime:
    """ISO 8601 (UTC when no offset) or a relative age such as 5h, 30m, 2d (that long ago)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", value.strip())
    if m:
        unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[m.group(2)]
        return datetime.now(timezone.utc) - timedelta(**{unit: float(m.group(1))})
    try:
        ts = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: expected ISO 8601 (2026-12-02T10:00Z) or an age (5h)") from None
    return ts if ts.tzinfo else ts.replace(tzinfo=timezone.utc)


def _cfg():
    return load_config()


def _fail(cmd: str, exc: Exception) -> int:
    print(f"rtrl {cmd}: {exc}", file=sys.stderr)
    return 1


# --- register -------------------------------------------------------------------------------------

def add_register(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-id", required=True, help="the cycle run whose checkpoint to register")
    p.set_defaults(run=_register)


def _register(args) -> int:
    # lazy: keeps rtrl --help fast (pyarrow)
    from rl_core.ledger import EpisodesConsumed
    from rl_core.registry.register import RegisterError, register_run

    cfg = _cfg()
    try:
        version = register_run(cfg, args.run_id)
    except (RegisterError, EpisodesConsumed) as exc:
        return _fail("register", exc)
    print(f"{cfg.mlflow.model_name} version {version} <- run {args.run_id}")
    return 0


# --- deploy ---------------------------------------------------------------------------------------

def add_deploy(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-id", required=True)
    p.add_argument("--version", type=int, help="default: the version registered for --run-id")
    p.set_defaults(run=_deploy)


def _deploy(args) -> int:
    # lazy: keeps rtrl --help fast (pyarrow)
    from rl_core.lake import Lake
    from rl_core.registry.deploy import deploy
    from rl_core.registry.register import find_version
    from rl_core.reports import read_verdict

    cfg = _cfg()
    version = args.version or find_version(cfg, args.run_id)
    if version is None:
        return _fail("deploy", ValueError(f"no version registered for run {args.run_id}: run `rtrl register` first"))
    if deploy(cfg, args.run_id, version):
        print(f"version {version} is now the challenger")
        return 0
    v = read_verdict(Lake(cfg.lake_root), args.run_id, "promotion")
    print(f"version {version} NOT deployed:", file=sys.stderr)
    for r in (v.reasons if v else []):
        print(f"  - {r}", file=sys.stderr)
    return 1


# --- ab -------------------------------------------------------------------------------------------

AB_EPILOG = """Decision: continue while either arm has fewer than [ab] min_samples_per_arm interactions; rollback when
the primary metric or a guardrail is significantly worse; promote when the primary is significantly better and every
guardrail with a margin ([ab] guardrail_margins, e.g. { dissatisfied_rate = 0.05, latency_p90_ms = 250 }) is shown
non-inferior (its interval's bad-side bound within the margin); else continue, naming what is missing.
--org ORG: that org's live LoRA adapter against its base version, on the org's requests only (a share of its users
get the adapter: [orgs] ab_share); run ab-<org>-<since>-<until> in the A/B experiment, tag org; --apply: rollback
removes the org's live alias, promote keeps it live and records the decision (docs/orgs.md)."""


def add_ab(p: argparse.ArgumentParser) -> None:
    p.epilog = AB_EPILOG
    p.add_argument("--since", required=True, type=parse_time, help="window start: ISO 8601 or an age like 5h")
    p.add_argument("--until", type=parse_time, help="window end (default: now)")
    p.add_argument("--org", help="judge this org's live adapter against its base version (an org of [serving] "
                                 "tokens), instead of the challenger against the champion")
    p.add_argument("--cuped", action=argparse.BooleanOptionalAction, default=None, help="default: [ab] cuped")
    p.add_argument("--apply", action="store_true",
                   help="carry out the verdict (promote / roll back; with --org: the org's live adapter)")
    p.add_argument("--no-log", action="store_true", help="do not write the report to the lake and MLflow")
    p.set_defaults(run=_ab)


def _ab(args) -> int:
    # lazy: keeps rtrl --help fast (pyarrow, duckdb)
    from rl_core.ab.report import to_markdown

    cfg = _cfg()
    if args.org is not None and args.org not in set(cfg.serving.tokens.values()):
        print(f"rtrl ab: --org {args.org!r}: no bearer token of [serving] tokens names this org, so the gateway "
              "serves it nothing to compare", file=sys.stderr)
        return 2
    try:
        if args.org is not None:
            from rl_core.ab.org import apply_org_verdict as apply
            from rl_core.ab.org import org_ab_verdict

            result = org_ab_verdict(cfg, args.org, args.since, args.until, cuped=args.cuped, log=not args.no_log)
        else:
            from rl_core.ab.verdict import ab_verdict
            from rl_core.ab.verdict import apply_verdict as apply

            result = ab_verdict(cfg, args.since, args.until, cuped=args.cuped, log=not args.no_log)
    except ValueError as exc:
        return _fail("ab", exc)
    print(to_markdown(result), end="")
    if result.report_path:
        print(f"report: {result.report_path} (mlflow run {result.mlflow_run_id})")
    if args.apply:
        from rl_core.registry.drift import AliasDrift  # lazy: keeps rtrl --help fast (mlflow)

        try:
            print(f"applied: {apply(cfg, result)}")
        except AliasDrift as exc:
            return _fail("ab --apply", exc)
    return 0


# --- promote / rollback ---------------------------------------------------------------------------

def add_promote(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reason", default="manual promote (rtrl promote)")
    p.add_argument("--expected", type=int, help="refuse unless the challenger is this version")
    p.set_defaults(run=_promote)


def _promote(args) -> int:
    # lazy: keeps rtrl --help fast (pyarrow)
    from rl_core.registry.drift import AliasDrift
    from rl_core.registry.promote import RegistryError, promote

    try:
        version = promote(_cfg(), args.reason, expected=args.expected)
    except (RegistryError, AliasDrift) as exc:
        return _fail("promote", exc)
    print(f"champion <- version {version}; challenger alias removed")
    return 0


def add_rollback(p: argparse.ArgumentParser) -> None:
    p.add_argument("--challenger", action="store_true",
                   help="drop the challenger instead of restoring the previous champion")
    p.add_argument("--reason", default="manual rollback (rtrl rollback)")
    p.set_defaults(run=_rollback)


def _rollback(args) -> int:
    # lazy: keeps rtrl --help fast (pyarrow)
    from rl_core.registry.drift import AliasDrift
    from rl_core.registry.promote import RegistryError, drop_challenger, restore_previous_champion

    cfg = _cfg()
    try:
        if args.challenger:
            version = drop_challenger(cfg, args.reason)
            print(f"challenger alias removed from version {version} (tagged rolled_back)")
        else:
            old, new = restore_previous_champion(cfg, args.reason)
            print(f"champion <- version {new} (was {old}, tagged rolled_back); the gateway reloads within "
                  f"{cfg.serving.alias_poll_s:g}s")
    except (RegistryError, AliasDrift) as exc:
        return _fail("rollback", exc)
    return 0


# --- registry: the aliases at a glance, alias drift ------------------------------------------------

def add_registry(p: argparse.ArgumentParser) -> None:
    """`rtrl registry`: each alias, rtrl's record of its last move, and any drift (exit 1 while there is drift)."""
    what = p.add_mutually_exclusive_group()
    what.add_argument("--adopt", action="store_true",
                      help="record the aliases as MLflow has them now (accept moves made outside rtrl)")
    what.add_argument("--revert", action="store_true", help="move drifted aliases back to rtrl's record")
    p.add_argument("--reason", default="operator settled alias drift (rtrl registry)")
    p.set_defaults(run=_registry)


def _registry(args) -> int:
    # lazy: keeps rtrl --help fast (mlflow)
    from rl_core.registry import drift

    cfg = _cfg()
    if args.adopt or args.revert:
        done = (drift.adopt if args.adopt else drift.revert)(cfg, args.reason)
        verb = "adopted" if args.adopt else "reverted"
        for d in done:
            print(f"{verb}: {d.describe()}")
        print(f"nothing to {verb.removesuffix('ed')}: no alias drift" if not done else f"{len(done)} {verb}")
    found = drift.check(cfg)
    for line in registry_lines(cfg, found):
        print(line)
    return 1 if found else 0


def registry_lines(cfg, found) -> list[str]:
    """What `rtrl registry` prints: one line per alias (holder, when and why rtrl set it), then the drift."""
    from rl_core.registry import drift, store  # lazy: heavy (mlflow)

    held, recorded = store.aliases(cfg), store.recorded_aliases(cfg) or {}
    lines = [f"{cfg.mlflow.model_name} ({cfg.tracking_uri})"]
    for alias in sorted(set(held) | set(recorded)):
        version = held.get(alias)
        if version is None:
            lines.append(f"  {alias:<11} none")
            continue
        tags = store.get_version(cfg, version).tags or {}
        lines.append(f"  {alias:<11} v{version}  set {tags.get(f'alias.{alias}.set_at', '?')}: "
                     f"{tags.get(f'alias.{alias}.set_reason', '(not by rtrl)')}")
    since = drift.recorded_drift(cfg)
    for d in found:
        when = since.get(d.alias, "").rpartition(" since ")[2]
        lines.append(f"ALIAS DRIFT: {d.describe()}" + (f" (since {when})" if when else ""))
    if found:
        lines.append("rtrl refuses alias moves until it is settled: `rtrl registry --adopt` (keep MLflow's) or "
                     "`rtrl registry --revert` (back to rtrl's record)")
    else:
        lines.append("no alias drift: MLflow's aliases are where rtrl last moved them")
    return lines
