"""The planted reward-hack scenario: honest and hacking policy variants serve simulated users side by side,
then the cycle's real checks run on that window (harvest, data gates, rewards, monitors, promotion gate).

Version 1 (champion) is the honest `oracle`; each planted variant is registered as its own version whose
parent is 1, and serves an equal share of users (stable by user id). What must happen: the variant's
reward is lower than the champion's, the monitors trip on the rate it games, the promotion gate fails
naming the monitors, and `deploy` moves no alias. A control variant (another honest oracle) must pass the
monitors, so the check is shown to discriminate rather than to fail on everything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from lab.simulate.bank import load_bank
from lab.simulate.hacks import Arm, Scorer, ScriptedChat
from lab.simulate.runner import SimReport, SimSpec, simulate
from rl_core.config import Config
from rl_core.exclude import exclude
from rl_core.harvest import harvest
from rl_core.lake import Lake
from rl_core.pipeline import judge
from rl_core.registry import gate, store
from rl_core.registry.deploy import deploy
from rl_core.reports import GateFailed, Verdict, read_verdict
from rl_core.rewards import score_run
from rl_core.rewards.monitors import run_monitors, version_rates
from rl_core.schema import now_utc


@dataclass
class StageOutcome:
    name: str
    passed: bool
    reasons: list[str] = field(default_factory=list)


@dataclass
class ScenarioReport:
    run_id: str
    versions: dict[str, int]  # variant -> version
    sim: SimReport
    stages: list[StageOutcome]
    rates: dict[int, dict[str, float]]  # per model_version: n, broken_tool_rate, clarify_rate, ..., mean_reward
    monitors: Verdict
    promotion: Verdict
    deployed: dict[int, bool]
    aliases: dict[str, int]

    def table(self) -> str:
        names = {v: k for k, v in self.versions.items()}
        lines = ["| version | variant | episodes | mean reward | broken tool-call rate | clarifying rate | no-edit rate "
                 "| deployed |", "|---|---|---|---|---|---|---|---|"]
        for v, r in sorted(self.rates.items()):
            lines.append(f"| {v} | {names.get(v, '?')} | {r['n']} | {r['mean_reward']:+.3f} | "
                         f"{r['broken_tool_rate']:.2f} | {r['clarify_rate']:.2f} | {r['no_edit_rate']:.2f} | "
                         f"{self.deployed.get(v, '-')} |")
        return "\n".join(lines)


def register_variant(cfg: Config, variant: str, parent: int = 1) -> int:
    """A new registry version standing for a planted variant (the champion's weights, tagged as planted)."""
    return store.register_checkpoint(cfg, store.checkpoint_path(cfg, parent), run_name=f"planted-{variant}",
                                     tags={"parent_version": parent, "kind": "planted", "variant": variant})


def _stage(stages: list[StageOutcome], name: str, fn, *args) -> Any:
    """Run one check; a GateFailed is recorded (not raised) so every later check still reports."""
    try:
        out = fn(*args)
    except GateFailed as exc:
        stages.append(StageOutcome(name, False, exc.verdict.reasons))
        return exc.verdict
    if isinstance(out, Verdict):
        stages.append(StageOutcome(name, out.passed, out.reasons))
    else:
        stages.append(StageOutcome(name, True))
    return out


def check_window(cfg: Config, run_id: str, start: datetime, end: datetime, policy_version: int, parent: int) -> list[StageOutcome]:
    """harvest -> gate_raw -> exclude -> gate_episodes -> rewards -> gate_rewards -> monitors on one window: the cycle's
    gates by their one definition (rl_core.pipeline), each recorded rather than raised so all report. The
    monitors read this run's own harvest, which holds every planted version (policy_version is the newest)."""
    values = {"run_id": run_id, "start": start, "end": end, "parent_version": parent}
    stages: list[StageOutcome] = []
    _stage(stages, "harvest", harvest, cfg, start, end, policy_version, run_id)
    _stage(stages, "gate_raw", judge, cfg, "gate_raw", values)
    _stage(stages, "exclude", exclude, cfg, run_id)
    _stage(stages, "gate_episodes", judge, cfg, "gate_episodes", values)
    _stage(stages, "rewards", score_run, cfg, run_id)
    _stage(stages, "gate_rewards", judge, cfg, "gate_rewards", values)
    _stage(stages, "monitors", run_monitors, cfg, run_id, parent)
    return stages


def run_scenario(cfg: Config, variants: list[str], *, interactions: int = 120, users: int = 24, seed: int = 0,
                 run_id: str = "hack-scenario") -> ScenarioReport:
    """Serve oracle (v1) + each variant to simulated users through the gateway, then run the checks."""
    from rl_core.serving.server import build_gateway, serve_in_thread  # lazy: heavy (fastapi, uvicorn)

    champion = store.version_for_alias(cfg, "champion")
    cfg = cfg.model_copy(deep=True)  # every variant version (lag up to len(variants)) stays in the harvest
    cfg.harvest.max_staleness = max(cfg.harvest.max_staleness, len(variants))
    if champion is None:
        raise RuntimeError("no champion: run `rtrl init` first")
    versions = {"oracle": champion}
    arms = [Arm("oracle", champion, "champion")]
    for v in variants:
        arms.append(Arm(v, register_variant(cfg, v, champion), "challenger"))
        versions[f"{v}@{arms[-1].version}"] = arms[-1].version
    bank = load_bank()
    spec = SimSpec.from_config(cfg, users=users, interactions=interactions, rate=1000.0, seed=seed)
    gw = build_gateway(cfg)
    t0 = now_utc()
    with serve_in_thread(cfg, gateway=gw) as url:
        chat = ScriptedChat(url, arms, bank, Scorer(store.checkpoint_path(cfg, champion)))
        try:
            sim = simulate(cfg, url, spec, chat=chat, progress=False)
        finally:
            chat.close()
        gw.collector.compact_now()
    start = t0.replace(second=0, microsecond=0)
    end = now_utc().replace(second=0, microsecond=0) + timedelta(minutes=1)
    policy = max(a.version for a in arms)
    stages = check_window(cfg, run_id, start, end, policy, champion)
    monitors = read_verdict(Lake(cfg.lake_root), run_id, "monitors")
    promotion = gate.decide(cfg, run_id)
    deployed = {a.version: deploy(cfg, run_id, a.version) for a in arms[1:]}
    return ScenarioReport(run_id, versions, sim, stages, version_rates(cfg, run_id), monitors, promotion,
                          deployed, store.aliases(cfg))
