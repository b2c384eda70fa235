"""The per-org branch of the cycle, as the calls an orchestrator needs: judge the live adapters, who trains, then
one org end to end.

`live_orgs` lists the orgs with a live adapter and `judge_org` judges one of them on the window's traffic (its
per-org A/B, rl_core/ab/org.py) and carries the verdict out: promote keeps it live, rollback takes it off the
org's traffic (a verdict on an adapter no longer live is stale and moves nothing). `org_targets` lists the orgs of the cycle's harvest with enough data; `adapt_org` runs one org's whole
pipeline (episodes, rewards, the cycle's data-quality gates and reward-hacking monitors on the org's run,
LoRA update of the champion, paired evals, registration, `live` alias when every verdict the cycle requires
and eval_org passed). Airflow maps `adapt_org` over `org_targets` (dynamic task mapping), so each
org is its own task instance: one org failing (too little data, a failed gate, a crash) fails only its
instance, and the others train, evaluate and deploy.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime

from rl_core.config import Config
from rl_core.orgs.pipeline import OrgRun, eligible_orgs, evaluate_org, prepare_org, train_org
from rl_core.orgs.registry import deploy_adapter, live_adapter, register_adapter
from rl_core.pipeline import BEFORE_TRAIN, run_gates
from rl_core.registry.store import known_versions
from rl_core.rewards.monitors import score_served


def live_orgs(cfg: Config) -> list[str]:
    """The orgs a bearer token serves that have a `live` adapter and have not opted out: the ones a run judges."""
    served = set(cfg.serving.tokens.values()) - set(cfg.harvest.opt_out_orgs)
    return sorted(org for org in served if live_adapter(cfg, org) is not None)


def judge_org(cfg: Config, start: datetime, end: datetime, org_id: str, dry_run: bool = False) -> dict:
    """The org's A/B over [start, end) (its live adapter's users against the org's users on the base alone; logged
    to the lake and MLflow like any A/B), carried out unless dry_run. What it decided and what was done."""
    from rl_core.ab.org import apply_org_verdict, org_ab_verdict  # lazy: DuckDB and the A/B's imports

    result = org_ab_verdict(cfg, org_id, start, end)
    action = "dry-run: not applied" if dry_run else apply_org_verdict(cfg, result)
    return {"org": org_id, "adapter_version": result.adapter_version, "decision": result.decision,
            "action": action, "n": dict(result.n), "reasons": list(result.reasons)}


def org_targets(cfg: Config, run_id: str, min_episodes: int | None = None) -> list[str]:
    """Orgs of runs/<run_id>/episodes.parquet with at least min_episodes (default gates.min_episodes)."""
    return sorted(eligible_orgs(cfg, run_id, min_episodes))


@dataclass
class OrgOutcome:
    org_id: str
    run_id: str  # the org's run folder, runs/<run_id>.<org>/
    episodes: int
    train_steps: int
    org_gain: float
    org_gain_se: float
    shared_passed: bool
    org_passed: bool
    version: int | None  # the adapter version registered (None in a dry run)
    adapter_version: str | None
    live: bool  # the `live` alias moved to it


def check_org_run(cfg: Config, o: OrgRun) -> None:
    """The cycle's checks before an update (rl_core.pipeline.BEFORE_TRAIN) on the org's run: the data-quality
    gates on its episodes and rewards, and the reward-hacking monitors on every turn the window served the
    org's users (versions newer than the base against it). Raises GateFailed with the first refusal."""
    score_served(cfg, o.run_id, o.start, o.end, max(known_versions(cfg), default=o.base_version), org_id=o.org_id)
    run_gates(cfg, BEFORE_TRAIN, {"run_id": o.run_id, "start": o.start, "end": o.end, "parent_version": o.base_version})


def adapt_org(cfg: Config, start: datetime, end: datetime, policy_version: int, run_id: str, org_id: str,
              dry_run: bool = False) -> dict:
    """One org end to end on top of policy_version (the champion). Raises on any failure (OrgError,
    GateFailed, TrainFailed, ...): the orchestrator marks that org's task failed and no alias moves."""
    o = OrgRun.of(cfg, start, end, policy_version, run_id, org_id)  # the org checked once, its run made once
    h = prepare_org(cfg, o)
    check_org_run(cfg, o)
    summary = train_org(cfg, o)
    ev = evaluate_org(cfg, o)
    version = name = None
    live = False
    if not dry_run:
        av = register_adapter(cfg, o)
        version, name = av.version, av.adapter_version
        live = deploy_adapter(cfg, o, av.version)
    return asdict(OrgOutcome(org_id, ev.run_id, h.n_episodes, summary.steps, ev.org_gain, ev.org_gain_se,
                             ev.shared_passed, ev.org_passed, version, name, live))
