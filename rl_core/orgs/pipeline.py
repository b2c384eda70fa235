"""One organisation's adapter: its episodes only -> rewards -> LoRA update of the champion -> paired evals.

Isolation by construction: every step of org O works in its own run folder, runs/<run_id>.<O>/, whose
episodes come from a harvest filtered to O (sql/harvest.sql's $org_id) with the same data rights as the
shared cycle (opt-out, forget). Rewards, the trainer's batches, eval results and reports are computed from
that folder alone, so no row of another organisation can reach them (tests/test_orgs_isolation.py plants
markers to check it). The trainer is the cycle's own (rl_core.train.launch.train) in LoRA mode: the
champion stays frozen, the adapter is saved beside the merged checkpoint evals load.

Evals: the shared suite (verdict "eval", the cycle's rule: no significant regression) and the org's own
tasks (rl_core/orgs/tasks.py; verdict "eval_org"), both paired against the champion (evals.compare).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from evals.compare import compare, compare_policies
from evals.harness import Budget
from evals.policies import EnginePolicy
from evals.report import markdown
from evals.runner import results_table, run_suite
from rl_core.config import Config
from rl_core.harvest import HarvestResult, harvest
from rl_core.ids import IdError, check_org_id, is_org_id
from rl_core.lake import Lake, RunDir
from rl_core.orgs.tasks import org_tasks
from rl_core.registry.store import checkpoint_path
from rl_core.reports import Verdict, write_verdict
from rl_core.rewards import score_run
from rl_core.train.launch import TrainSummary, train


class OrgError(ValueError):
    """An organisation cannot get an adapter (bad id, opted out, too little data); the message says which."""


def check_org(cfg: Config, org_id: str) -> str:
    """org_id under the one rule for org ids (rl_core.ids.check_org_id), and not opted out; else OrgError."""
    try:
        check_org_id(org_id)
    except IdError as exc:
        raise OrgError(str(exc)) from None
    if org_id in cfg.harvest.opt_out_orgs:
        raise OrgError(f"org_id {org_id!r} opted out of training (harvest.opt_out_orgs)")
    return org_id


def org_run_id(run_id: str, org_id: str) -> str:
    """The run folder of org_id's adapter within cycle run_id (runs/<run_id>.<org_id>/)."""
    return f"{run_id}.{org_id}"


@dataclass(frozen=True)
class OrgRun:
    """One org's share of a cycle run: the org (checked once, at `of`), its window, the version its adapter
    trains on, its run id and folder. The org path (prepare, checks, train, eval, register, deploy) is handed
    this value and never rebuilds a folder from the cycle's run id and the org's name."""

    cycle_run_id: str
    org_id: str
    start: datetime
    end: datetime
    base_version: int  # the champion the adapter trains on (and is served on)

    @classmethod
    def of(cls, cfg: Config, start: datetime, end: datetime, base_version: int, run_id: str, org_id: str) -> OrgRun:
        return cls(run_id, check_org(cfg, org_id), start, end, int(base_version))

    @property
    def run_id(self) -> str:
        return org_run_id(self.cycle_run_id, self.org_id)

    @property
    def dir(self) -> RunDir:
        return Lake.run(self.run_id)


def org_config(cfg: Config) -> Config:
    """cfg for an adapter update: same trainer, LoRA on (the base checkpoint stays frozen)."""
    c = cfg.model_copy(deep=True)
    c.train.lora = True
    return c


def eligible_orgs(cfg: Config, run_id: str, min_episodes: int | None = None) -> dict[str, int]:
    """{org_id: episodes} for orgs of cycle run_id's harvest with at least min_episodes (default
    gates.min_episodes). The harvest already left out opted-out and forgotten rows."""
    lake = Lake(cfg.lake_root)
    need = cfg.gates.min_episodes if min_episodes is None else min_episodes
    orgs = lake.read_parquet(lake.run(run_id).episodes).select(["org_id"])
    counts = orgs.group_by("org_id").aggregate([("org_id", "count")]).to_pylist()
    return {r["org_id"]: r["org_id_count"] for r in sorted(counts, key=lambda r: r["org_id"])
            if r["org_id"] is not None and r["org_id_count"] >= need and r["org_id"] not in cfg.harvest.opt_out_orgs
            and is_org_id(r["org_id"])}


def prepare_org(cfg: Config, o: OrgRun) -> HarvestResult:
    """Harvest the org's episodes of the window into its own run folder and score them."""
    result = harvest(cfg, o.start, o.end, o.base_version, o.run_id, org_id=o.org_id)
    if result.n_episodes == 0:
        raise OrgError(f"org_id {o.org_id!r} has no episodes in [{o.start.isoformat()}, {o.end.isoformat()})")
    score_run(cfg, o.run_id)
    return result


def train_org(cfg: Config, o: OrgRun) -> TrainSummary:
    """LoRA update of the base version (the champion) on the org's prepared run."""
    summary = train(org_config(cfg), o.run_id, o.base_version)
    if not summary.adapter or not (Path(summary.adapter) / "adapter_config.json").is_file():
        raise OrgError(f"training of {o.org_id} produced no adapter folder (summary.adapter={summary.adapter!r})")
    return summary


@dataclass
class OrgEval:
    run_id: str
    org_id: str
    shared_passed: bool  # no regression on the shared suite
    org_passed: bool  # no regression on the org's tasks
    org_gain: float  # paired mean difference of `passed` on the org's tasks (candidate - champion)
    org_gain_se: float
    org_n: int
    shared_diff: float
    shared_se: float


def _suite(tasks, policy, budget: Budget, workers: int):
    """One side's run on the org's tasks; an engine (started again if the shared suite closed it) is stopped after."""
    try:
        return run_suite(tasks, policy, budget, workers)
    finally:
        if isinstance(policy, EnginePolicy):
            policy.close()


def evaluate_org(cfg: Config, o: OrgRun, candidate=None, baseline=None) -> OrgEval:
    """Paired evals of the org's merged checkpoint against its base version: shared suite, then the org's tasks.

    Writes runs/<run_id>.<org>/eval/ (shared, verdict "eval") and eval_org/ (verdict "eval_org").
    candidate/baseline override the checkpoint-backed policies (scripted policies in tests)."""
    orun, org_id, base_version = o.run_id, o.org_id, o.base_version
    if candidate is None:
        ckpt = cfg.models_dir / "runs" / orun / "checkpoint"
        candidate = EnginePolicy(ckpt, cfg, name=f"adapter:{orun}")
    if baseline is None:
        baseline = EnginePolicy(checkpoint_path(cfg, base_version), cfg, name=f"rtrl-policy/{base_version}")
    shared = compare_policies(cfg, orun, candidate, baseline)  # closes an engine after its side's suite

    tasks = org_tasks(cfg, org_id)
    budget = Budget.from_config(cfg.eval)
    cand = _suite(tasks, candidate, budget, cfg.eval.workers)
    base = _suite(tasks, baseline, budget, cfg.eval.workers)
    result = compare(orun, cand, base, cfg.eval.tolerance, cfg.eval.z)
    lake = Lake(cfg.lake_root)
    folder = o.dir.eval_org
    lake.write_parquet(f"{folder}/results.parquet",
                       pa.concat_tables([results_table(cand, "candidate"), results_table(base, "baseline")]))
    lake.write_json(f"{folder}/comparison.json", asdict(result))
    lake.write_bytes(f"{folder}/report.md", markdown(result, candidate.name, baseline.name).encode())
    gain = next(m for m in result.metrics if m.metric == "passed")
    s = next(m for m in shared.metrics if m.metric == "passed")
    details = {"org_id": org_id, "n_tasks": len(tasks), "diff_passed": gain.mean_diff, "se_passed": gain.se,
               "candidate_pass_rate": gain.candidate_mean, "baseline_pass_rate": gain.baseline_mean}
    write_verdict(lake, orun, Verdict(name="eval_org", passed=result.passed, reasons=result.reasons, details=details))
    return OrgEval(orun, org_id, shared.passed, result.passed, gain.mean_diff, gain.se, gain.n, s.mean_diff, s.se)


def org_rows(table: pa.Table, org_id: str) -> int:
    """Rows of table belonging to org_id (for reports and checks)."""
    return int(pc.sum(pc.equal(table["org_id"], org_id)).as_py() or 0)
