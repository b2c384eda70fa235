"""The files every checkpoint's run holds at its root, so MLflow's compare view shows them side by side.

MLflow 3's compare view lists as "common artifacts" only files at the root of every compared run (folders are
skipped), so each cycle's run gets the same five root files (rl_core/registry/layout.COMMON_FILES["train"]):
`reward_hist.png`, `eval_deltas.png`, `eval_report.md`, `verdicts.json` (written here at registration, with a
placeholder where the run has nothing to show, so the paths never differ) and `card.md` (the description's
table, rewritten by card.describe whenever a number changes). The full reports stay in the folders `eval/`,
`verdicts/` and `charts/`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from rl_core.lake import Lake
from rl_core.reports import Verdict


def _figure(height: float):
    import matplotlib  # heavy: imported only when a card is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, height))
    return plt, fig, ax


def _save(plt, fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _placeholder(path: Path, title: str, text: str) -> None:
    plt, fig, ax = _figure(3.2)
    ax.axis("off")
    ax.set_title(title)
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=12, color="#666666")
    _save(plt, fig, path)


def reward_hist(run_id: str, rewards_table: pa.Table | None, path: Path) -> None:
    rewards = [r for r in rewards_table["reward"].to_pylist() if r is not None] if rewards_table is not None else []
    if not rewards:
        _placeholder(path, f"{run_id}: episode rewards", "no scored episodes")
        return
    plt, fig, ax = _figure(3.2)
    ax.hist(rewards, bins=20, color="#3b7dd8")
    ax.set(title=f"{run_id}: episode rewards (n={len(rewards)})", xlabel="reward", ylabel="episodes")
    _save(plt, fig, path)


def eval_deltas(run_id: str, metrics: dict[str, float], path: Path) -> None:
    deltas = {k.removeprefix("eval/delta_pass_rate").lstrip("_") or "all": v
              for k, v in metrics.items() if k.startswith("eval/delta_pass_rate")}
    if not deltas:
        _placeholder(path, f"{run_id}: eval pass-rate delta vs parent", "no eval comparison")
        return
    plt, fig, ax = _figure(0.45 * len(deltas) + 1.4)
    names = sorted(deltas)
    ax.barh(names, [deltas[n] for n in names], color=["#2a9d55" if deltas[n] >= 0 else "#d1495b" for n in names])
    ax.axvline(0, color="black", lw=0.8)
    ax.set(title=f"{run_id}: eval pass-rate delta vs parent", xlabel="candidate - parent")
    _save(plt, fig, path)


def write_all(root: Path, lake: Lake, run_id: str, verdicts: dict[str, Verdict], rewards: pa.Table | None,
              metrics: dict[str, float]) -> None:
    """The folders (eval/, verdicts/, charts/: the full reports) and the common root files, under root."""
    for sub in ("eval", "verdicts", "charts"):
        (root / sub).mkdir()
    for name, v in verdicts.items():
        (root / "verdicts" / f"{name}.json").write_text(v.model_dump_json(indent=2))
    (root / "verdicts.json").write_text(json.dumps(
        {name: v.model_dump(mode="json") for name, v in sorted(verdicts.items())}, indent=2))
    for name in ("report.md", "comparison.json", "results.parquet"):
        rel = f"{lake.run(run_id).eval}/{name}"
        if lake.exists(rel):
            with lake.fs.open(lake.path(rel), "rb") as f:
                (root / "eval" / name).write_bytes(f.read())
    report = root / "eval" / "report.md"
    (root / "eval_report.md").write_bytes(report.read_bytes() if report.is_file()
                                          else f"# {run_id}\n\nno eval report for this run\n".encode())
    reward_hist(run_id, rewards, root / "reward_hist.png")
    eval_deltas(run_id, metrics, root / "eval_deltas.png")
    has = {"reward_hist.png": rewards is not None,
           "eval_deltas.png": any(k.startswith("eval/delta_pass_rate") for k in metrics)}
    for name in (n for n, there in has.items() if there):  # charts/: real charts only, never a placeholder
        (root / "charts" / name).write_bytes((root / name).read_bytes())
