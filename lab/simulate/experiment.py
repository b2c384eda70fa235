"""`rtrl experiment --cycles K`: the proof that the loop learns. K full cycles (simulated traffic through the
gateway -> the Airflow DAG -> deploy -> the next cycle's A/B verdict), learning curves logged to MLflow.

Each cycle is lab.cycle.run_cycle: one long-lived gateway (started once, following the aliases like a
production one) serves champion + challenger (`auto`), the same seeded simulated users drive it, `airflow dags test` runs the whole DAG on exactly that window (its first task is
the A/B verdict on the previous cycle's challenger). Afterwards we read back, per cycle: mean reward, edit-
persisted rate, eval pass rate, clarifying rate, broken tool-call rate, KL. The learning claim is paired:
every cycle has the same users (same seed, same personas), so each user's mean reward in the first cycle
is paired with the same user's in the last, and the 95% CI of the mean difference is reported.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lab import warm
from lab.cycle import airflow_env, print_report, run_cycle
from lab.simulate import heldout
from rl_core.config import Config, load_config
from rl_core.features import episode_features, feature_rates_of
from rl_core.init import init
from rl_core.lake import Lake
from rl_core.registry import store
from rl_core.registry.store import known_versions, version_for_alias
from rl_core.reports import read_verdict
from rl_core.rewards.monitors import score_served, version_rates
from rl_core.runtime.procs import environ, exit_on_sigterm, stop
from rl_core.serving import gateway as gw

CURVES = ("mean_reward", "edit_persisted_rate", "eval_pass_rate", "clarifying_rate", "broken_tool_rate", "no_edit_rate",
          "kl")


@dataclass
class CycleMetrics:
    cycle: int
    run_id: str
    dag_rc: int
    interactions: int
    episodes: int
    mean_reward: float | None
    edit_persisted_rate: float | None
    eval_pass_rate: float | None
    clarifying_rate: float | None
    broken_tool_rate: float | None
    kl: float | None
    new_version: int | None
    aliases: dict[str, int]
    served: dict[str, int]  # model_version -> episodes in this cycle
    user_reward: dict[str, float] = field(default_factory=dict)  # user_id -> mean reward (for the pairing)
    user_task_reward: dict[str, float] = field(default_factory=dict)  # the same without the latency term
    seconds: dict[str, float] = field(default_factory=dict)
    no_edit_rate: float | None = None  # answers with no tool call and no complete code block (the monitors' rate)
    verdicts: dict[str, bool] = field(default_factory=dict)  # the DAG's checks in this cycle (gate -> passed)
    feature_rates: dict[str, dict] = field(default_factory=dict)  # feature -> Rate (k, n, rate, 95% CI) of answers
    user_features: dict[str, dict[str, float]] = field(default_factory=dict)  # preferred feature -> user -> rate
    window: list[str] = field(default_factory=list)  # [start, end) of the cycle's traffic, ISO
    role: str = "train"  # train | measured (serves, trains nothing) | baseline (v1 serves the measured requests)
    requests: list[dict] = field(default_factory=list)  # the simulator's record of every request (outcomes.py)


@dataclass
class Paired:
    n_users: int
    first_mean: float
    last_mean: float
    diff: float
    se: float
    ci_low: float
    ci_high: float

    @property
    def excludes_zero(self) -> bool:
        return self.ci_low > 0 or self.ci_high < 0


def _read(lake: Lake, run_id: str, name: str):
    p = lake.run(run_id).file(name)
    return lake.read_parquet(p) if lake.exists(p) else None


def score_all_traffic(cfg: Config, report) -> str:
    """Harvest + score every episode served in the cycle's window, whatever version served it (the DAG's own
    harvest keeps only the policy's lag range), under run id `<run_id>-served`: what users got."""
    from datetime import datetime

    # every registered version: a challenger rolled back during the cycle still served its users
    newest = max(known_versions(cfg), default=1)
    return score_served(cfg, report.run_id, datetime.fromisoformat(report.start), datetime.fromisoformat(report.end),
                        newest)


def cycle_metrics(cfg: Config, k: int, report) -> CycleMetrics:
    """What one cycle's files say (all served episodes + rewards, train summary, eval verdict)."""
    lake = Lake(cfg.lake_root)
    served = score_all_traffic(cfg, report)
    eps, rws = _read(lake, served, "episodes.parquet"), _read(lake, served, "rewards.parquet")
    m = CycleMetrics(k, report.run_id, report.dag_rc, report.interactions or 0, 0, None, None, None, None, None,
                     None, report.version, dict(report.aliases or {}), {}, seconds=dict(report.seconds or {}))
    if eps is not None and eps.num_rows:
        e = eps.to_pandas()
        m.episodes = len(e)
        m.edit_persisted_rate = float((e["edit_persisted"].fillna(False).astype(bool)).mean())
        m.served = {str(k): int(v) for k, v in e["model_version"].value_counts().sort_index().items()}
        if rws is not None and rws.num_rows:
            r = rws.to_pandas().merge(e[["event_id", "user_id"]], on="event_id")
            m.mean_reward = float(r["reward"].mean())
            m.clarifying_rate = float(r["is_clarifying"].mean())
            m.broken_tool_rate = float(r["broken_tool_call"].mean())
            rates = version_rates(cfg, served).values()
            m.no_edit_rate = sum(x["n"] * x["no_edit_rate"] for x in rates) / max(sum(x["n"] for x in rates), 1)
            m.user_reward = {u: float(x) for u, x in r.groupby("user_id")["reward"].mean().items()}
            # latency depends on machine load as much as on the policy: also pair without it
            r["task_reward"] = r["reward"] - cfg.rewards.weights.get("latency", 0.0) * r["latency"]
            m.user_task_reward = {u: float(x) for u, x in r.groupby("user_id")["task_reward"].mean().items()}
        m.feature_rates, m.user_features = feature_rates(e, preferred_features(cfg))
    m.verdicts, m.window = dict(report.verdicts or {}), [report.start, report.end]
    ev = read_verdict(lake, report.run_id, "eval")
    if ev is not None:
        m.eval_pass_rate = _num(ev.details.get("candidate_pass_rate"))
    summary = lake.read_train_summary(report.run_id)
    if summary is not None:
        m.kl = _num(summary.kl)
    return m


def preferred_features(cfg: Config) -> list[str]:
    """The features the simulated users hold a preference on (shared first, then the orgs' conventions)."""
    s = cfg.simulate
    names = ([s.preference.feature] if s.preference else []) + [p.feature for _, p in sorted(s.conventions.items())]
    return list(dict.fromkeys(names))


def feature_rates(episodes, per_user: list[str]) -> tuple[dict[str, dict], dict[str, dict[str, float]]]:
    """Every feature's rate over a cycle's served answers (with its 95% Wilson CI), and for the preferred
    features each user's own rate (for the paired test)."""
    feats = [episode_features(t, c) for t, c in zip(episodes["completion_text"], episodes["tool_calls"], strict=True)]
    rates = {name: asdict(r) for name, r in feature_rates_of(feats).items()}
    users: dict[str, dict[str, float]] = {}
    for name in per_user:
        hits: dict[str, list[bool]] = {}
        for u, f in zip(episodes["user_id"], feats, strict=True):
            hits.setdefault(u, []).append(f[name])
        users[name] = {u: sum(h) / len(h) for u, h in sorted(hits.items())}
    return rates, users


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def t_interval(d: list[float]) -> tuple[float, float, float, float]:
    """Mean of d with its standard error and 95% t interval: (mean, se, low, high). len(d) >= 2."""
    from scipy import stats

    n = len(d)
    mean = sum(d) / n
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1)) / math.sqrt(n)
    t = float(stats.t.ppf(0.975, n - 1))
    return mean, se, mean - t * se, mean + t * se


def paired(first: dict[str, float], last: dict[str, float]) -> Paired | None:
    """Mean per-user difference (last - first) with a paired t interval (95%)."""
    users = sorted(set(first) & set(last))
    if len(users) < 2:
        return None
    n = len(users)
    mean, se, lo, hi = t_interval([last[u] - first[u] for u in users])
    return Paired(n, sum(first[u] for u in users) / n, sum(last[u] for u in users) / n, mean, se, lo, hi)


def plot(curves: list[CycleMetrics], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(15, 6.5))
    axes.flat[-1].axis("off")  # 7 curves on a 2 x 4 grid
    xs = [c.cycle for c in curves]
    for ax, name in zip(axes.flat, CURVES, strict=False):
        ys = [getattr(c, name) for c in curves]
        ax.plot(xs, [y if y is not None else float("nan") for y in ys], marker="o")
        ax.set_title(name.replace("_", " "))
        ax.set_xlabel("cycle")
        ax.set_xticks(xs)
        ax.grid(alpha=0.3)
    fig.suptitle("rtrl learning curves")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def markdown(curves: list[CycleMetrics], pair: Paired | None, cfg: Config, seconds: float,
             task_pair: Paired | None = None) -> str:
    def f(x, spec=".3f"):
        return "n/a" if x is None else format(x, spec)

    lines = [f"profile `{cfg.profile}`, base `{cfg.model.base}`, {len(curves)} cycles, {seconds / 60:.1f} min", "",
             "| cycle | run | DAG | interactions | served episodes | mean reward | edit persisted | eval pass | clarifying "
             "| broken tool calls | no edit | KL | new version | aliases after |", "|" + "---|" * 14]
    for c in curves:
        lines.append(f"| {c.cycle} | {c.run_id} | {'ok' if c.dag_rc == 0 else f'rc {c.dag_rc}'} | {c.interactions} | "
                     f"{c.episodes} | {f(c.mean_reward, '+.3f')} | {f(c.edit_persisted_rate)} | {f(c.eval_pass_rate)} | "
                     f"{f(c.clarifying_rate)} | {f(c.broken_tool_rate)} | {f(c.no_edit_rate)} | {f(c.kl, '.4f')} | "
                     f"{c.new_version} | "
                     f"{json.dumps(c.aliases)} |")
    lines.append("")
    for label, p in (("mean reward", pair), ("mean reward without the latency term", task_pair)):
        if p is None:
            lines.append(f"paired {label}: not enough users present in both the first and the last cycle")
            continue
        lines.append(f"paired by user, last cycle - first cycle, {label} over {p.n_users} users: "
                     f"{p.diff:+.3f} (SE {p.se:.3f}, 95% CI [{p.ci_low:+.3f}, {p.ci_high:+.3f}]; "
                     f"first {p.first_mean:+.3f}, last {p.last_mean:+.3f}) -> "
                     + ("CI excludes zero" if p.excludes_zero else "CI includes zero"))
    return "\n".join(lines) + "\n"


def log_mlflow(cfg: Config, curves: list[CycleMetrics], pair: Paired | None, png: Path, md: str, params: dict,
               task_pair: Paired | None = None) -> str:
    """One MLflow run in experiment `<experiment>-learning`: a metric per curve with step = cycle, PNG + table."""
    c = store.client(cfg)
    exp = store.experiment_id(cfg, "learning")
    run = c.create_run(exp, run_name=f"experiment-{len(curves)}-cycles", tags={"kind": "experiment"})
    rid = run.info.run_id
    for k, v in params.items():
        c.log_param(rid, k, v)
    for m in curves:
        for name in CURVES:
            if getattr(m, name) is not None:
                c.log_metric(rid, name, getattr(m, name), step=m.cycle)
    log_sim(cfg, c, rid, curves)
    for prefix, p in (("paired", pair), ("paired_task", task_pair)):
        if p is not None:
            for k, v in asdict(p).items():
                c.log_metric(rid, f"{prefix}_{k}", float(v))
    c.log_artifact(rid, str(png))
    c.log_text(rid, md, "results.md")
    c.log_dict(rid, [asdict(m) for m in curves], "curves.json")
    c.set_terminated(rid)
    return rid


def log_sim(cfg: Config, c, rid: str, curves: list[CycleMetrics]) -> None:
    """What users got, as MLflow metrics grouped `sim/*` (step = cycle): the mean reward and every answer
    feature's rate with its CI, on the experiment's run and on the run of each version that served a cycle
    alone (so a version's page shows how its answers were received)."""
    for m in curves:
        sim = {"sim/mean_reward": m.mean_reward} | {
            f"sim/{name}/{k}": r[k] for name, r in m.feature_rates.items() for k in ("rate", "ci_low", "ci_high")}
        sim = {k: v for k, v in sim.items() if v is not None and math.isfinite(v)}
        runs = [rid]
        if len(m.served) == 1:  # one version served the whole cycle: its own run gets the numbers too
            mv = c.get_model_version(cfg.mlflow.model_name, next(iter(m.served)))
            runs += [mv.run_id] if mv.run_id else []
        for run in runs:
            for k, v in sim.items():
                c.log_metric(run, k, float(v), step=m.cycle)


def train_base(cfg: Config, train_from: str) -> int | None:
    """The version a cycle updates: None (the DAG's default, the champion) or, for "latest", the version
    serving as challenger when there is one (the newest policy that passed every gate), else the champion."""
    if train_from == "champion":
        return None
    return version_for_alias(cfg, "challenger") or version_for_alias(cfg, "champion")


def run_experiment(cfg: Config, cycles: int, interactions: int | None, out_dir: Path, train_from: str = "champion",
                   warm_start: bool = True, measure_last: bool = False, dag_id: str | None = None,
                   plans: list[heldout.CyclePlan] | None = None) -> tuple[list[CycleMetrics], Paired | None, str]:
    """K cycles on one gateway; measure_last: the last cycle serves and is measured, and trains nothing;
    dag_id: the DAG each cycle runs (default the cycle's; the org-adapter DAG for an org experiment);
    plans: one per cycle (heldout.plans: the bank its users ask, which users and how many, their raters, its
    interactions; run_dag False: it only serves, as a baseline does). Default: the config's bank and users in every cycle, as before; the plan
    then only collects each request's record (CycleMetrics.requests)."""
    if cycles < 1:
        raise ValueError(f"cycles must be >= 1, got {cycles}")
    plans = plans or [heldout.CyclePlan("measured" if measure_last and k == cycles else "train")
                      for k in range(1, cycles + 1)]
    if len(plans) != cycles:
        raise ValueError(f"{len(plans)} cycle plans for {cycles} cycles")
    t0 = time.time()
    curves: list[CycleMetrics] = []
    init(cfg, check_generation=False)  # the gateway needs a champion to serve
    # one gateway for every cycle, as in production: it follows the aliases (weights swapped in place) and its
    # WAL seals 2 s after the traffic stops, so no cycle pays an engine start or a gateway shutdown
    env = airflow_env(cfg) | {"RTRL_SERVING__SEGMENT_MAX_AGE_S": "2"}
    # and one warm server (lab/warm.py): every cycle's `airflow dags test` and trainer are forked from a
    # process that has already imported torch, DeepSpeed, transformers, GX and Airflow
    wproc, sock = warm.start_server(airflow_env(cfg), out_dir / "warm.log") if warm_start else (None, None)
    proc = None
    try:  # one cleanup for a failed start and for the end: the gateway, then the warm server even if that raised
        proc, url = gw.start_gateway(cfg, env, out_dir / "gateway.log")
        if wproc:
            warm.wait_ready(wproc, sock, out_dir / "warm.log")
        started_s = round(time.time() - t0, 1)
        for k, plan in enumerate(plans, start=1):
            print(f"[experiment] cycle {k}/{cycles} (gateway {url})" + (f" [{plan.role}]" if plan.role != "train" else ""),
                  file=sys.stderr)
            dag = plan.run_dag if plan.run_dag is not None else not (measure_last and k == cycles)
            with heldout.planned(plan):
                report = run_cycle(cfg, interactions=plan.interactions or interactions, log_dir=out_dir / f"cycle-{k}",
                                   policy_version=train_base(cfg, train_from), gateway_url=url,
                                   warm_socket=str(sock) if sock else None, run_dag=dag, dag_id=dag_id)
            if k == 1:  # the one start-up belongs to the first cycle's time
                report.seconds = {"gateway_start": started_s, **(report.seconds or {})}
            print_report(cfg, report)
            t = time.time()
            curves.append(cycle_metrics(cfg, k, report))
            curves[-1].seconds["metrics"] = round(time.time() - t, 1)
            curves[-1].role, curves[-1].requests = plan.role, plan.records
    finally:
        try:
            stop(proc)
        finally:
            warm.stop_server(wproc, sock)
    pair = paired(curves[0].user_reward, curves[-1].user_reward) if len(curves) > 1 else None
    task_pair = paired(curves[0].user_task_reward, curves[-1].user_task_reward) if len(curves) > 1 else None
    png = plot(curves, out_dir / "learning_curves.png")
    md = markdown(curves, pair, cfg, time.time() - t0, task_pair)
    (out_dir / "results.md").write_text(md)
    (out_dir / "curves.json").write_text(json.dumps([asdict(m) for m in curves], indent=2))
    params = {"cycles": cycles, "interactions": interactions or cfg.simulate.interactions, "profile": cfg.profile,
              "base": cfg.model.base, "users": cfg.simulate.users, "seed": cfg.simulate.seed,
              "challenger_share": cfg.serving.challenger_share, "train_from": train_from, "lr": cfg.train.lr}
    rid = log_mlflow(cfg, curves, pair, png, md, params, task_pair)
    return curves, pair, rid


def add_experiment(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cycles", type=int, default=3, help="number of full cycles (K)")
    p.add_argument("--interactions", type=int, default=None, help="simulated interactions per cycle")
    p.add_argument("--users", type=int, default=None, help="simulated users (the same users every cycle)")
    p.add_argument("--challenger-share", type=float, default=0.5,
                   help="A/B share of the challenger during the experiment (default 0.5: faster verdicts; 1.0: "
                        "every user gets the newest policy, so the per-user pairing compares v1 with the last)")
    p.add_argument("--train-from", choices=("champion", "latest"), default="champion",
                   help="what each cycle updates: the champion (production; updates compound only through A/B "
                        "promotions) or the latest deployed challenger (updates compound every cycle)")
    p.add_argument("--out", default=None, help="folder for results.md, curves.json, learning_curves.png")
    p.add_argument("--cold", action="store_true",
                   help="start `airflow dags test` and the trainer as fresh processes each cycle instead of forking "
                        "them from a warm server that has the heavy modules imported (lab/warm.py)")
    p.add_argument("--protocol", type=Path, default=None,
                   help="run a pre-registered protocol file (experiments/*/*.toml): its sizes, seeds and config "
                        "replace the flags above; writes summary-seed<k>.json per seed, pooled.json, a plot")
    p.add_argument("--seed", type=int, action="append", default=None,
                   help="with --protocol: run only this seed of the protocol (repeatable; default all)")
    p.add_argument("--report", action="store_true",
                   help="with --protocol: run nothing, rewrite results.md, pooled.json and the plot from the summaries in --out")
    p.set_defaults(run=_run)


def _run(args) -> int:
    if args.protocol:
        from lab.simulate import protocol  # lazy: circular (protocol <-> experiment)

        try:
            with exit_on_sigterm():
                return protocol.main(args.protocol, args.seed, None, Path(args.out) if args.out else None,
                                     run=not args.report)
        except (ValueError, OSError) as exc:  # a bad protocol file: name it, run nothing
            print(f"rtrl experiment --protocol: {exc}", file=sys.stderr)
            return 2
    if args.cycles < 1:
        print(f"rtrl experiment: --cycles must be >= 1, got {args.cycles}", file=sys.stderr)
        return 2
    over = {"RTRL_SERVING__CHALLENGER_SHARE": str(args.challenger_share)}
    if args.users:
        over["RTRL_SIMULATE__USERS"] = str(args.users)
    with environ(over):
        cfg = load_config()
        out = Path(args.out) if args.out else cfg.home_path / "experiments" / time.strftime("%Y%m%dT%H%M%S")
        out.mkdir(parents=True, exist_ok=True)
        with exit_on_sigterm():  # the gateway, its engines and the warm server stop with us
            curves, pair, rid = run_experiment(cfg, args.cycles, args.interactions, out, args.train_from,
                                               warm_start=not args.cold)
    print((out / "results.md").read_text())
    print(f"learning curves: {out / 'learning_curves.png'}   MLflow run {rid} "
          f"(experiment {cfg.mlflow.experiment}-learning)")
    return 0 if all(c.dag_rc == 0 for c in curves) else 1
