"""The human-readable side of an eval: a markdown table and a PNG chart of pass rate per task kind."""

from __future__ import annotations

import math
from pathlib import Path


def _fmt(v: float) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


def metrics_table(columns: dict[str, dict[str, float]]) -> str:
    """A markdown table: one row per metric, one column per run (e.g. {"v2": {...}, "v1": {...}})."""
    names = list(columns)
    keys = list(dict.fromkeys(k for m in columns.values() for k in m))
    lines = ["| metric | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    lines += [f"| {k} | " + " | ".join(_fmt(columns[n].get(k, math.nan)) for n in names) + " |" for k in keys]
    return "\n".join(lines)


def markdown(result, candidate_name: str, baseline_name: str) -> str:
    """The paired comparison report (an EvalComparison) as markdown."""
    lines = [f"# eval {result.run_id}: {result.verdict}", "",
             f"candidate `{candidate_name}` vs baseline `{baseline_name}`", "",
             "## Paired comparison (Miller 2024)", "",
             f"| metric | tasks | pairs | candidate | baseline | diff | paired SE | interval | detectable change "
             f"({getattr(result, 'power', 0.8):.0%} power) | regression |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for m in result.metrics:
        lines.append(f"| {m.metric} | {m.n} | {m.n_pairs} | {m.candidate_mean:.3f} | {m.baseline_mean:.3f} "
                     f"| {m.mean_diff:+.3f} | {m.se:.3f} | [{m.ci_low:+.3f}, {m.ci_high:+.3f}] | {_fmt(m.mde)} "
                     f"| {'YES' if m.regression else 'no'} |")
    lines += ["", "## Aggregates", "", metrics_table({"candidate": result.candidate, "baseline": result.baseline})]
    if result.reasons:
        title = "Why it regressed" if result.verdict == "regression" else "Why it cannot judge"
        lines += ["", f"## {title}", ""] + [f"- {r}" for r in result.reasons]
    return "\n".join(lines) + "\n"


def pass_rate_png(columns: dict[str, dict[str, float]], path: str | Path) -> Path:
    """Bar chart of pass rate per task kind, one bar group per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = sorted({k[len("pass_rate_"):] for m in columns.values() for k in m if k.startswith("pass_rate_")})
    kinds = ["all", *kinds]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    width = 0.8 / max(1, len(columns))
    for i, (name, m) in enumerate(columns.items()):
        vals = [m.get("pass_rate" if k == "all" else f"pass_rate_{k}", 0.0) for k in kinds]
        ax.bar([x + i * width for x in range(len(kinds))], vals, width, label=name)
    ax.set_xticks([x + width * (len(columns) - 1) / 2 for x in range(len(kinds))], kinds)
    ax.set_ylim(0, 1)
    ax.set_ylabel("pass rate")
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
