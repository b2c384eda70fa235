"""The picture of a protocol (learning_curves.png): the mean reward and each watched feature's rate per cycle,
one line per seed, each org's line on its convention; a protocol whose registered outcome is not the reward adds
that outcome's paired change per seed; a replay protocol adds each org adapter's change against v1 on the same
requests. Drawn from the summaries alone, so `rtrl experiment --protocol F --report` redraws it."""

from __future__ import annotations

from pathlib import Path

from lab.simulate.protocol_report import PRIMARY_LABELS


def plot(summaries: list[dict], features: list[str], path: Path, guard_tolerance: float | None = None) -> Path:
    """Learning curves of a protocol: mean reward per cycle (95% CI over users) and each preferred feature's
    rate per cycle (95% Wilson CI), one line per seed. A replay protocol adds a panel of each org adapter's
    change against v1 on the same requests (the convention, the guard and the answer's shape), since its
    feature panels can show only v1's cycle for every user."""
    import matplotlib

    matplotlib.use("Agg")  # headless: files only
    import matplotlib.pyplot as plt

    shaped = {f for s in summaries if s.get("replay") for f in (s.get("orgs") or {}).get("shape", {})}
    changes = bool(shaped)  # a replay protocol's summaries carry each org's change in the answer's shape
    primary = any(s.get("primary_metric", "mean_reward") != "mean_reward" for s in summaries)
    m = 1 + len(features)  # the reward's panel and one per feature
    n = m + changes + primary
    fig, grid = plt.subplots((n + 2) // 3, min(n, 3), figsize=(5 * min(n, 3), 4 * ((n + 2) // 3)), squeeze=False)
    axes = list(grid.flat)
    for ax in axes[n:]:
        ax.axis("off")
    for s in summaries:
        cyc = [c["cycle"] for c in s["cycles"]]
        ys = [c["mean_reward"] for c in s["cycles"]]
        err = [[y - c["reward_ci"][0], c["reward_ci"][1] - y] if c["reward_ci"] else [0, 0]
               for y, c in zip(ys, s["cycles"], strict=True)]
        axes[0].errorbar(cyc, ys, yerr=list(zip(*err, strict=True)), marker="o", capsize=3, label=f"seed {s['seed']}")
        for ax, name in zip(axes[1:m], features, strict=True):
            r = [c["feature_rates"][name] for c in s["cycles"]]
            ax.errorbar(cyc, [x["rate"] for x in r], capsize=3, marker="o", label=f"seed {s['seed']}, all",
                        yerr=[[x["rate"] - x["ci_low"] for x in r], [x["ci_high"] - x["rate"] for x in r]])
            by_org = (s.get("orgs") or {}).get("org_rates_by_cycle", {}) if name == features[0] else {}
            for org, ys in by_org.items():  # orgs: each org's line, on the protocol's feature (what it measures)
                ax.plot(list(range(1, len(ys) + 1)), [y if y is not None else float("nan") for y in ys], marker="s", linestyle="--",
                        label=f"seed {s['seed']}, {org}")
    orgs = any(s.get("orgs") for s in summaries)
    replayed = any(s.get("replay") for s in summaries)  # org lines: x=1 v1, x=2 the org's adapter, same requests
    axes[0].set_title("mean reward (95% CI over users)")
    for ax, name in zip(axes[1:m], features, strict=True):
        mark = (" - each org's convention" if orgs else " - preferred") if name == features[0] else ""
        mark = mark or (" - v1 (changes: last panel)" if changes and name in shaped else "")
        ax.set_title(f"{name} rate (95% CI){mark}")
        ax.set_ylim(0, 1)
    if changes:
        _plot_changes(axes[m], summaries, guard_tolerance)
    if primary:
        _plot_primary(axes[m + changes], summaries)
    ticks = sorted({c["cycle"] for s in summaries for c in s["cycles"]} | ({1, 2} if replayed else set()))
    for ax in axes[:m]:
        ax.set_xticks(ticks, ["v1", "org adapter (replay)"] if replayed else [str(t) for t in ticks])
        ax.set_xlabel("cycle 1's requests, replayed" if replayed else "cycle (1 = base v1)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(summaries[0]["protocol"] if summaries else "")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_changes(ax, summaries: list[dict], guard_tolerance: float | None) -> None:
    """Replay: each org adapter's mean per-user change against v1 (95% CI), per feature: the convention first,
    then the answer's shape (the guard among them); the guard's floor as a dotted line."""
    feats: list[str] = []
    for s in summaries:
        o = s.get("orgs") or {}
        for f in [s["feature"], *o.get("shape", {})]:
            feats += [f] if f not in feats else []
    for s in summaries:
        o = s.get("orgs") or {}
        per = {s["feature"]: o.get("org_moves", {}), **o.get("shape", {})}
        orgs = sorted(o.get("org_moves", {}))
        for j, org in enumerate(orgs):
            pts = [(i, per[f][org]) for i, f in enumerate(feats) if per.get(f, {}).get(org, {}).get("mean_rate_change") is not None]
            xs = [i + (j - (len(orgs) - 1) / 2) * 0.15 for i, _ in pts]  # orgs side by side
            ys = [iv["mean_rate_change"] for _, iv in pts]
            ax.errorbar(xs, ys, capsize=3, marker="s", linestyle="none", label=f"seed {s['seed']}, {org}", color=f"C{1 + j}",
                        yerr=[[y - iv["ci_low"] for y, (_, iv) in zip(ys, pts, strict=True)],
                              [iv["ci_high"] - y for y, (_, iv) in zip(ys, pts, strict=True)]])
    ax.axhline(0, color="grey", linewidth=0.8)
    guard = next((g["feature"] for s in summaries for g in ((s.get("orgs") or {}).get("guard") or {}).values()), None)
    if guard and guard_tolerance:
        ax.axhline(-guard_tolerance, color="red", linestyle=":", linewidth=1, label=f"guard: {guard} > -{guard_tolerance:g}")
    ax.set_xticks(range(len(feats)), feats, rotation=15)
    ax.set_title("org adapter - v1 on the same requests (per user, 95% CI)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _plot_primary(ax, summaries: list[dict]) -> None:
    """The registered outcome (e.g. edits persisted on held-out requests): each seed's per-user paired change, last
    cycle against v1, with its 95% CI; what the rule judges, beside the reward it is not."""
    metrics = {s.get("primary_metric", "mean_reward") for s in summaries}
    label = PRIMARY_LABELS.get(next(iter(metrics)), "primary") if len(metrics) == 1 else "primary outcome"
    for i, s in enumerate(summaries):
        p = s["primary"]
        ax.errorbar([i], [p["diff"]], yerr=[[p["diff"] - p["ci_low"]], [p["ci_high"] - p["diff"]]], capsize=4,
                    marker="o", color=f"C{i}", label=f"seed {s['seed']}: {p['first_mean']:.3f} -> {p['last_mean']:.3f}, "
                                                      f"{p['n_users']} users")
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(summaries)), [f"seed {s['seed']}" for s in summaries])
    ax.set_title(f"primary: {label}, last - v1 (per user, paired, 95% CI)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
