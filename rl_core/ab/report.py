"""The A/B report: a markdown table and a PNG chart, kept in the lake and logged to MLflow.

One MLflow run per analysed window (tag ab_window), reused when the same window is analysed again, so
a rerun overwrites its artifacts instead of piling up runs. It is named `ab-<since>-<until>`, its times in the
format of the cycles' run ids (rl_core/window.py: `ab-20261202T0500-20261202T1000`). Decision and versions are tags (a late
rerun with more feedback may change them; MLflow params could not be changed). The deciding numbers are also
under `_decide/` (rl_core/registry/layout.AB_DECIDE: counts per arm, the primary metric's difference, interval
and p, the reward's; with guardrail margins also `guardrails_noninferior`), the report and chart are at the run's
root as well as under `ab/` (MLflow's compare view shows only root files), and the run's description (tag
mlflow.note.content) states the decision, the counts and the reasons. Each guardrail with a margin adds
`ab/<metric>_margin` and `ab/<metric>_noninferior` (1 shown, 0 not) and a row of the report's margins table.

An org's A/B of its adapter (rl_core/ab/org.py) has a run of its own: ab_window `orgs/<org>/<since>_<until>` (also
its folder under ab/ in the lake), named `ab-<org>-<since>-<until>`, tags `org`, `adapter_version`,
`adapter_model_version`, `base_version`; its decision is recorded on the adapter's version
(rl_core/orgs/registry.record_ab), never on a policy version's run.
"""

from __future__ import annotations

import io
import json
import math
import tempfile
from pathlib import Path

from rl_core.ab.result import OrgABResult, bad_bound
from rl_core.config import Config
from rl_core.ids import mlflow_filter_value
from rl_core.lake import Lake
from rl_core.registry import card, layout, store
from rl_core.window import _stamp

ARTIFACT_DIR = "ab"


def window_key(result) -> str:
    key = f"{result.since:%Y%m%dT%H%M%SZ}_{result.until:%Y%m%dT%H%M%SZ}"
    return f"orgs/{result.org_id}/{key}" if isinstance(result, OrgABResult) else key


def run_name(result) -> str:
    """`ab-<since>-<until>`, the times as in a cycle's run id (`cycle-20261202T1000`); an org's A/B:
    `ab-<org>-<since>-<until>`."""
    org = f"{result.org_id}-" if isinstance(result, OrgABResult) else ""
    return f"ab-{org}{_stamp(result.since)}-{_stamp(result.until)}"


def subject(result) -> str:
    """What was compared: `challenger v3 vs champion v2`, or `org-acme's adapter <name> (v2) vs its base v1`."""
    if isinstance(result, OrgABResult):
        return (f"{result.org_id}'s adapter {result.adapter_version} (v{result.adapter_model_version}) vs its base "
                f"v{result.base_version} without it")
    return f"challenger v{result.challenger_version} vs champion v{result.champion_version}"


def decide_metrics(result, primary: str) -> dict[str, float]:
    """_decide/* of the A/B run (layout.AB_DECIDE; with guardrail margins, guardrails_noninferior too: 1 when every
    guardrail with a margin was shown non-inferior)."""
    out = {f"n_{arm}": float(result.n.get(arm, 0)) for arm in ("champion", "challenger")}
    for prefix, name in (("primary", primary), ("reward", "reward")):
        m = result.metrics.get(name)
        if m is not None:
            out |= {f"{prefix}_diff": m.diff, f"{prefix}_p": m.p_value}
            if prefix == "primary":
                out |= {"primary_lo": m.lo, "primary_hi": m.hi}
    checked = [m.noninferior for m in result.metrics.values() if m.margin is not None]
    if checked:
        out["guardrails_noninferior"] = float(all(checked))
    return {layout.decide_key(k): float(v) for k, v in out.items()}


def note(result) -> str:
    """The A/B run's description: the decision, what it rests on, every reason."""
    counts = ", ".join(f"{arm} n={result.n.get(arm, 0)} ({result.users.get(arm, 0)} users)"
                       for arm in ("champion", "challenger"))
    lines = [f"**A/B {result.decision}**: {subject(result)}, {counts}", ""] + [f"- {r}" for r in result.reasons]
    return "\n".join(lines)[:8000]


def to_markdown(result) -> str:
    pct = int(round((1 - result.alpha) * 100))
    lines = [
        f"## A/B: {subject(result)}",
        f"window {result.since.isoformat()} .. {result.until.isoformat()}; decision **{result.decision}**",
        "",
    ]
    if isinstance(result, OrgABResult):
        lines += [f"only {result.org_id}'s requests: arm champion = answered by v{result.base_version} without an "
                  f"adapter, arm challenger = answered by the adapter {result.adapter_version}", ""]
    lines += [
        "| arm | interactions | users |",
        "|---|---:|---:|",
    ]
    lines += [f"| {arm} | {result.n.get(arm, 0)} | {result.users.get(arm, 0)} |" for arm in ("champion", "challenger")]
    lines += [
        "",
        f"| metric | champion | challenger | diff | {pct}% CI | p | method | |",
        "|---|---:|---:|---:|---|---:|---|---|",
    ]
    for m in result.metrics.values():
        flag = "better" if m.better else "worse" if m.worse else ""
        lines.append(
            f"| {m.name} | {m.champion:.4g} | {m.challenger:.4g} | {m.diff:+.4g} | [{m.lo:+.4g}, {m.hi:+.4g}] "
            f"| {m.p_value:.3g} | {m.method} | {flag} |"
        )
    lines += _margins_table(result, pct)
    lines += ["", "reasons:"] + [f"- {r}" for r in result.reasons]
    return "\n".join(lines) + "\n"


def _margins_table(result, pct: int) -> list[str]:
    """The guardrails with a non-inferiority margin ([ab] guardrail_margins): margin, bad-side bound, verdict."""
    rows = [m for m in result.metrics.values() if m.margin is not None]
    if not rows:
        return []
    lines = ["", f"| guardrail | margin | bad-side bound ({pct}% CI) | non-inferior |", "|---|---:|---:|---|"]
    for m in rows:
        bound = bad_bound(m.lo, m.hi, m.higher_is_better)
        limit = f"> {-m.margin:+.4g}" if m.higher_is_better else f"< {m.margin:+.4g}"
        verdict = "yes" if m.noninferior else "not shown"
        lines.append(f"| {m.name} | {m.margin:g} | {bound:+.4g} (needs {limit}) | {verdict} |")
    return lines


def chart_png(result) -> bytes:
    """Relative difference (% of the champion's value) with its interval, one row per metric."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = list(result.metrics.values())
    fig, ax = plt.subplots(figsize=(7, 0.6 * max(len(metrics), 1) + 1.5))
    for i, m in enumerate(metrics):
        scale = 100.0 / abs(m.champion) if m.champion else 0.0
        color = "tab:green" if m.better else "tab:red" if m.worse else "tab:gray"
        ax.errorbar(m.diff * scale, i, xerr=[[(m.diff - m.lo) * scale], [(m.hi - m.diff) * scale]],
                    fmt="o", color=color, capsize=4)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(metrics)), [m.name for m in metrics])
    ax.set_xlabel("challenger - champion (% of champion)")
    title = (f"{result.org_id}: {result.adapter_version} vs v{result.base_version}" if isinstance(result, OrgABResult)
             else f"v{result.challenger_version} vs v{result.champion_version}")
    ax.set_title(f"{title}: {result.decision}")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def publish(cfg: Config, result) -> None:
    """Write report.json / report.md / chart.png to the lake (ab/<window>/) and to an MLflow run."""
    files = {
        "report.json": json.dumps(result.model_dump(mode="json", exclude={"report_path", "mlflow_run_id"}),
                                  indent=2, sort_keys=True).encode(),
        "report.md": to_markdown(result).encode(),
        "chart.png": chart_png(result),
    }
    lake = Lake(cfg.lake_root)
    key = window_key(result)
    for name, data in files.items():
        lake.write_bytes(f"ab/{key}/{name}", data)
    result.report_path = lake.url("ab", key)
    result.mlflow_run_id = _log_run(cfg, result, key, files)
    if isinstance(result, OrgABResult):  # on the adapter's version; a policy version's run is no place for it
        from rl_core.orgs.registry import record_ab  # lazy: heavy (the org pipeline's imports)

        if result.adapter_model_version is not None:
            record_ab(cfg, result.org_id, result.adapter_model_version, result.decision, card.ab_summary(result))
    else:
        card.log_ab(cfg, result)  # ab/* on the challenger's own run, beside its train/reward/eval metrics


def _log_run(cfg: Config, result, key: str, files: dict[str, bytes]) -> str:
    """The window's run in the A/B experiment (found by its ab_window tag, else created): tags, the description,
    ab/* and _decide/* metrics, the files. Returns its id."""
    from mlflow.entities import Metric  # lazy: heavy (mlflow)

    c = store.client(cfg)
    exp = store.experiment_id(cfg, "ab")
    found = c.search_runs([exp], filter_string=f"tags.ab_window = {mlflow_filter_value(key)}", max_results=1)
    run_id = found[0].info.run_id if found else c.create_run(exp, run_name=run_name(result),
                                                            tags={"ab_window": key, "kind": "ab"}).info.run_id
    c.update_run(run_id, name=run_name(result))  # a run made under the earlier name format takes the new one
    tags = {"decision": result.decision, "champion_version": result.champion_version,
            "challenger_version": result.challenger_version, "since": result.since.isoformat(),
            "until": result.until.isoformat(), "cuped": result.cuped}
    if isinstance(result, OrgABResult):
        tags |= {"org": result.org_id, "adapter_version": result.adapter_version,
                 "adapter_model_version": result.adapter_model_version, "base_version": result.base_version}
    for k, v in tags.items():
        c.set_tag(run_id, k, str(v))
    c.set_tag(run_id, card.NOTE, note(result))
    values = {f"ab/n_{arm}": float(n) for arm, n in result.n.items()}
    for m in result.metrics.values():
        for field in ("champion", "challenger", "diff", "lo", "hi", "p_value"):
            values[f"ab/{m.name}_{field}"] = float(getattr(m, field))
        if m.margin is not None:  # [ab] guardrail_margins: the margin and its verdict (1 non-inferior, 0 not shown)
            values |= {f"ab/{m.name}_margin": m.margin, f"ab/{m.name}_noninferior": float(bool(m.noninferior))}
    values |= decide_metrics(result, cfg.ab.primary)
    stamp = int(result.until.timestamp() * 1000)
    c.log_batch(run_id, metrics=[Metric(k, v, stamp, 0) for k, v in values.items() if math.isfinite(v)])
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in files.items():
            (Path(tmp) / name).write_bytes(data)
        c.log_artifacts(run_id, tmp, ARTIFACT_DIR)
        for name in layout.COMMON_FILES["ab"]:  # at the root too: the compare view shows only root files
            c.log_artifact(run_id, str(Path(tmp) / name))
    c.set_terminated(run_id)
    return run_id
