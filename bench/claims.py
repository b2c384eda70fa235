"""Every number of the claims page (docs/results.md), recomputed from the committed summaries.

    python bench/claims.py            (or `rtrl bench claims`; reads experiments/*/ and docs/results/*.json)

Why: a claim is worth what its numbers are worth, and a page typed by hand drifts from the runs it reports.
So the page's numbers come from here: the committed seed summaries (experiments/<question>/*.json, written by
`rtrl experiment --protocol`), pooled by the same function `rtrl experiment --report` uses
(lab.simulate.protocol._pool: the paired test of a shared protocol, org_protocol.pooled_orgs for an org one),
each pooled result checked against the committed pooled file where there is one; and the registered protocols
(experiments/<question>/*.toml) in the order git first added them (under bench/protocols/ before issue 42), to
count how many designs on a question were registered before a result. The benchmarks' JSON (the feature census,
the eval gate's census and checks) stays in docs/results/. tests/test_claims.py runs this on the committed files:
every line it prints must be in docs/results.md verbatim, and every decimal of the page outside a quoted block (`>`)
must be one printed here.
Prints markdown; `##` lines name the block and are not part of the page.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab.simulate.org_protocol import pooled_orgs  # noqa: E402
from lab.simulate.protocol import Protocol, _pool  # noqa: E402
from lab.simulate.protocol_report import PRIMARY_LABELS  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "docs" / "results"  # the benchmarks' JSON: the feature census, the eval gate's census and checks
EXPERIMENTS = REPO / "experiments"  # one folder per question: its registered protocols and seed summaries
FORMER = "bench/protocols"  # where protocols were registered before issue 42 moved them: git's adds are there
QUESTIONS = ("shared-preference", "org-conventions", "coding-quality")  # tiny.toml is a smoke test of the machinery: no claim
SHARED, ORG = "shared-preference-v5", "org-conventions-v12-pooled"  # the two registered results
# what may differ between two protocols that train and measure the same way (the seeds, the test, the budget)
NOT_TRAINING = {"name", "question", "registered", "choice", "success", "seeds", "min_seeds_excluding_zero",
                "max_minutes"}
POOLED_KEYS = ("n_users", "diff", "se", "ci_low", "ci_high", "seeds_excluding_zero", "success")

f = "{:+.3f}".format


def r3(x: float) -> str:
    return f"{x:.3f}"


def ci(d: dict, lo: str = "ci_low", hi: str = "ci_high") -> str:
    return f"[{f(d[lo])}, {f(d[hi])}]"


def family(name: str) -> str:
    return re.sub(r"-v\d+.*$", "", name)


def short(name: str) -> str:
    """org-conventions-v10-replica -> v10-replica; org-conventions -> v1."""
    return name[len(family(name)) + 1:] or "v1"


def load_protocols(folder: Path = EXPERIMENTS) -> dict[str, tuple[Path, Protocol]]:
    """name -> (file, the protocol as registered), from every experiment's folder. The Protocol model only:
    load_protocol would also build the config each protocol ran with, which this report does not need."""
    out = {}
    for p in sorted(folder.glob("*/*.toml")):
        proto = Protocol(**tomllib.loads(p.read_text())["protocol"])
        out[proto.name] = (p, proto)
    return out


def load_summaries(folder: Path = EXPERIMENTS, results: Path = RESULTS) -> tuple[dict[str, list[dict]],
                                                                                 dict[str, dict], dict | None]:
    """(protocol -> its seed summaries by seed, protocol -> its committed pooled file (with `file`), the census):
    the summaries from every experiment's folder, the census from the benchmarks' results."""
    seeds: dict[str, list[dict]] = {}
    pools: dict[str, dict] = {}
    census = None
    for p in sorted(folder.glob("*/*.json")) + sorted(results.glob("*.json")):
        d = json.loads(p.read_text())
        if "protocol_file" in d:
            seeds.setdefault(d["protocol"], []).append(d)
        elif "protocol" in d and "seeds" in d:
            pools[d["protocol"]] = {"file": p.name, **d}
        elif "meta" in d and "table" in d:
            census = d
    return {k: sorted(v, key=lambda s: s["seed"]) for k, v in seeds.items()}, pools, census


def registrations(paths: list[Path]) -> dict[str, tuple[str, str, int, str]]:
    """file name -> (short commit, date, unix time, full commit) of the commit that added it; empty without git.
    A file moved since (git mv) is added again where it went: the commit that first added its name, at its
    path or under FORMER, is its registration."""
    specs = [str(p) for p in paths] + [f"{FORMER}/{p.name}" for p in paths]
    try:
        out = subprocess.run(["git", "log", "--diff-filter=A", "--format=%x00%h %ad %at %H", "--date=short",
                              "--name-only", "--", *specs], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    found: dict[str, tuple[str, str, int, str]] = {}
    for block in out.split("\x00")[1:]:
        head, *names = [x for x in block.splitlines() if x.strip()]
        h, date, t, full = head.split()
        for n in names:
            found[Path(n).name] = (h, date, int(t), full)  # git log runs newest first: the last seen is the add
    return found


def is_ancestor(a: str, b: str) -> bool:
    """Whether commit a is b or an ancestor of b (the protocol was in the code the run started on)."""
    return subprocess.run(["git", "merge-base", "--is-ancestor", a, b], cwd=REPO, capture_output=True).returncode == 0


def pooled(proto: Protocol, summaries: list[dict]) -> dict | None:
    """The protocol's test over the seeds committed, as `rtrl experiment --report` computes it."""
    return _pool(summaries, proto) if summaries else None


def same_as_committed(pool: dict | None, committed: dict | None) -> str:
    if pool is None or committed is None:
        return ""
    same = all((pool.get(k) == committed.get(k)) if not isinstance(pool.get(k), float)
               else abs(pool[k] - committed[k]) < 1e-9 for k in POOLED_KEYS)
    return f"equals the committed {committed['file']}" if same else f"DIFFERS from the committed {committed['file']}"


def result(pool: dict | None, primary: str = "mean_reward") -> str:
    if not pool:
        return "no committed summary"
    what = "DiD" if pool.get("kind") == "did" else PRIMARY_LABELS.get(primary, primary)  # a DiD by the pool's kind
    return f"{what} {f(pool['diff'])} {ci(pool)}, {pool['n_users']} users"


class Claims:
    def __init__(self, experiments: Path = EXPERIMENTS, results: Path = RESULTS):
        self.protos = {n: pp for n, pp in load_protocols(experiments).items() if family(n) in QUESTIONS}
        self.seeds, self.pools, self.census = load_summaries(experiments, results)
        self.reg = registrations([p for p, _ in self.protos.values()])
        # registration order: the commit that added each file (name order where git cannot say)
        self.order = sorted(self.protos, key=lambda n: (self.reg.get(self.protos[n][0].name, ("", "", 0, ""))[2],
                                                        family(n), int((re.findall(r"\d+", short(n)) or ["1"])[0])))
        self.pooled = {n: pooled(proto, self.seeds.get(n, [])) for n, (_, proto) in self.protos.items()}

    def committed(self, name: str) -> str:
        h, date, *_ = self.reg.get(self.protos[name][0].name, ("n/a", "n/a", 0, ""))
        return f"{h} ({date})"

    def registered_first(self, name: str) -> str:
        """Whether the commit that added the protocol is in the history of every run's own commit."""
        runs, reg = self.seeds.get(name, []), self.reg.get(self.protos[name][0].name)
        if not runs or not reg:
            return "no run" if not runs else "n/a"
        return "yes" if all(is_ancestor(reg[3], s["commit"].removesuffix("-dirty")) for s in runs) else "NO"

    def before(self, name: str) -> list[str]:
        i = self.order.index(name)
        return [n for n in self.order[:i] if family(n) == family(name)]

    def rule_met(self, name: str) -> bool | None:
        p = self.pooled[name]
        return None if p is None else bool(p["success"])

    def unchanged(self, name: str) -> str:
        """Whether the protocol file is byte for byte the one its runs recorded (their protocol_sha256)."""
        runs = self.seeds.get(name, [])
        if not runs:
            return "no run"
        sha = hashlib.sha256(self.protos[name][0].read_bytes()).hexdigest()
        return "yes" if all(s["protocol_sha256"] == sha for s in runs) else "NO"

    # the blocks of the page

    def designs_line(self, name: str) -> str:
        prior = self.before(name)
        replicas = [n for n in prior if n.endswith("-replica")]
        met = [short(n) for n in prior if self.rule_met(n)]
        designs = len(prior) - len(replicas) + 1
        first = {"yes": "in the code of every one of its runs", "NO": "NOT in the code of all of its runs"}.get(
            self.registered_first(name), "its runs not checked")
        return (f"`{name}`: committed {self.committed(name)}, {first}; "
                f"{len(prior)} protocols on this question were registered before it "
                f"({', '.join(short(n) for n in prior)}"
                + (f"; {len(replicas)} of them a replica of an earlier design" if replicas else "")
                + "); registered rules met among them: " + (", ".join(met) if met else "none")
                + f"; it is design {designs}.")

    def registry(self) -> list[str]:
        lines = ["| protocol | committed | in every run's code | seeds with a summary | result, pooled over those "
                 "seeds' users | rule met | file as its runs recorded it |", "|---|---|---|---|---|---|---|"]
        for n in self.order:
            seeds = [s["seed"] for s in self.seeds.get(n, [])]
            registered = self.protos[n][1].seeds
            have = ", ".join(map(str, seeds)) + (f" of {', '.join(map(str, registered))}" if seeds != registered
                                                 and seeds else "") if seeds else "none"
            met = {True: "yes", False: "no", None: "n/a"}[self.rule_met(n)]
            lines.append(f"| {n} | {self.committed(n)} | {self.registered_first(n)} | {have} | "
                         f"{result(self.pooled[n], self.protos[n][1].primary)} | {met} | "
                         f"{self.unchanged(n)} |")
        return lines

    def pooled_checks(self) -> list[str]:
        return [f"{n}: recomputed from its seed summaries, {same_as_committed(self.pooled[n], self.pools[n])}"
                for n in self.order if n in self.pools]

    def shared(self) -> list[str]:
        runs, pool = self.seeds[SHARED], self.pooled[SHARED]
        w = self.protos[SHARED][1].config["rewards"]["weights"]
        lines = ["| seed | users | mean reward, v1 -> v2 | paired diff, 95% CI | summary_first per user, paired diff "
                 "| complete code block | no-edit answers | v2's eval pass rate | monitors | A/B reward diff (decision) "
                 "| A/B edits persisted diff | minutes |", "|" + "---|" * 12]
        gains = []
        for s in runs:
            p, fp, (c0, c1) = s["primary"], s["feature_rate_paired"], s["cycles"][:2]
            m = s["ab"]["metrics"]
            cb = [c["feature_rates"]["code_block"]["rate"] for c in (c0, c1)]
            lines.append(
                f"| {s['seed']} | {p['n_users']} | {f(p['first_mean'])} -> {f(p['last_mean'])} | {f(p['diff'])} "
                f"{ci(p)} | {f(fp['diff'])} {ci(fp)} | {r3(cb[0])} -> {r3(cb[1])} | {r3(c0['no_edit_rate'])} -> "
                f"{r3(c1['no_edit_rate'])} | {r3(c0['eval_pass_rate'])} | "
                f"{'pass' if s['monitors']['passed'] else 'TRIPPED'} | {f(m['reward']['diff'])} "
                f"{ci(m['reward'], 'lo', 'hi')} ({s['ab']['decision']}) | {f(m['edit_persisted_rate']['diff'])} "
                f"{ci(m['edit_persisted_rate'], 'lo', 'hi')} | {s['minutes']} |")
            # the A/B reward gain less what its edit and follow-up rates carry at the protocol's weights
            rest = (m["reward"]["diff"] - w["edit_persisted"] * m["edit_persisted_rate"]["diff"]
                    - w["dissatisfied_followup"] * m["dissatisfied_rate"]["diff"])
            gains.append((s["seed"], rest, m["reward"]["diff"]))
        lines += ["", f"Pooled over {pool['n_users']} users of seeds {', '.join(map(str, pool['seeds']))}: "
                      f"{f(pool['diff'])} (SE {pool['se']:.3f}, 95% CI {ci(pool)}); {pool['seeds_excluding_zero']} "
                      f"of {len(runs)} seeds' own CIs above zero; registered rule met: "
                      f"{'yes' if pool['success'] else 'no'}",
                  "", "Share of the A/B reward gain not carried by edits persisted or dissatisfied follow-ups "
                      "(the A/B's own rates at the protocol's weights): "
                      + ", ".join(f"{100 * r / g:.0f}% (seed {k})" for k, r, g in gains)
                      + f"; {100 * sum(r for _, r, _ in gains) / sum(g for *_, g in gains):.0f}% of the three "
                        "seeds' gains together"]
        if self.census:
            row = next(r for r in self.census["table"] if r["feature"] == self.protos[SHARED][1].feature)
            lines += ["", f"The census of the base model before any update: {row['feature']} in {r3(row['rate'])} "
                          f"[{r3(row['ci_low'])}, {r3(row['ci_high'])}] of {row['answers']} answers"]
        return lines

    def trained_like(self, name: str) -> list[str]:
        """The protocols that train and replay exactly as `name` does (whatever their seeds or test)."""
        def training(n: str) -> dict:
            return {k: v for k, v in self.protos[n][1].model_dump().items() if k not in NOT_TRAINING}
        return [n for n in self.order if training(n) == training(name)]

    def orgs(self) -> list[str]:
        like = [n for n in self.trained_like(ORG) if self.seeds.get(n)]
        runs = [(n, s) for n in like for s in self.seeds[n]]
        lines = ["| seed | protocol | DiD (acme - globex), 95% CI | acme's move (wants it) | globex's move (rejects it) "
                 "| writes_code guard: lowest org change [its CI] | complete code block: lowest org change | "
                 "every registered check | A/B |", "|" + "---|" * 9]
        for n, s in runs:
            o = s["orgs"]
            mv = o["org_moves"]
            g = min(o["guard"].items(), key=lambda kv: kv[1]["mean_rate_change"])
            cb = min(o["shape"]["code_block"].items(), key=lambda kv: kv[1]["mean_rate_change"])
            failed = [k for k, v in s["checks"].items() if not v]
            lines.append(
                f"| {s['seed']} | {n} | {f(o['did']['diff'])} {ci(o['did'])} | "
                f"{f(mv['org-acme']['mean_rate_change'])} {ci(mv['org-acme'])} | "
                f"{f(mv['org-globex']['mean_rate_change'])} {ci(mv['org-globex'])} | "
                f"{f(g[1]['mean_rate_change'])} ({g[0]}) {ci(g[1])} | {f(cb[1]['mean_rate_change'])} ({cb[0]}) | "
                + ("yes" if not failed else "no: " + ", ".join(failed)) + f" | {s['ab']['decision']} |")
        pool, every = self.pooled[ORG], pooled_orgs([s for _, s in runs], "v10's training", [], 0)
        dids = [s["orgs"]["did"]["diff"] for _, s in runs]
        clear = sum(s["orgs"]["did"]["ci_low"] > 0 for _, s in runs)
        tol = self.protos[ORG][1].guard_tolerance
        cb_fail = [f"seed {s['seed']}" for _, s in runs
                   if min(v["mean_rate_change"] for v in s["orgs"]["shape"]["code_block"].values()) <= -tol]
        wide = [str(s["seed"]) for _, s in runs if min(g["ci_low"] for g in s["orgs"]["guard"].values()) < -tol]
        mv = pool["org_moves"]
        lines += ["", f"Registered test ({ORG}, seeds {' and '.join(map(str, pool['seeds']))}): DiD {f(pool['diff'])} "
                      f"over {pool['n_users']} users (SE {pool['se']:.3f}, Welch 95% CI {ci(pool)}); acme "
                      f"{f(mv['org-acme']['mean_rate_change'])} {ci(mv['org-acme'])}, globex "
                      f"{f(mv['org-globex']['mean_rate_change'])} {ci(mv['org-globex'])}; registered rule met: "
                      f"{'yes' if pool['success'] else 'no'}",
                  "", f"Every committed seed of this training ({', '.join(short(n) for n in like)}; seeds "
                      f"{', '.join(str(s['seed']) for _, s in runs)}): a seed's own CI clears zero in {clear} of "
                      f"{len(runs)}; the DiD runs from {f(min(dids))} to {f(max(dids))}; pooled, descriptive (not a "
                      f"registered test): {f(every['diff'])} over {every['n_users']} users (SE {every['se']:.3f}, "
                      f"95% CI {ci(every)})",
                  "", f"The writes_code guard is judged on each org's mean change (above -{tol:.2f}); an org's 95% CI "
                      f"reaches below -{tol:.2f} in seeds {', '.join(wide) or 'none'}; v4's guard (each org's "
                      f"complete code block change above -{tol:.2f}) would fail: " + (", ".join(cb_fail) or "no seed")]
        return lines

    def blocked(self) -> list[str]:
        """Every committed seed whose update a production check refused: the monitors, or an org adapter's gate."""
        lines = ["| protocol | seed | what refused it | no-edit answers, v1 -> updated | complete code block | "
                 "A/B on the reward | applied |", "|---|---|---|---|---|---|---|"]
        for n in self.order:
            for s in self.seeds.get(n, []):
                c0, c1 = s["cycles"][0], s["cycles"][-1]
                if "orgs" in s:
                    refused = [f"{o}'s {k}" for o, v in s["orgs"]["org_verdicts"].items() for k, ok in v.items()
                               if not ok]
                    if refused:
                        lines.append(f"| {n} | {s['seed']} | {', '.join(refused)} | | | {s['ab']['decision']} | "
                                     "the adapter never went live |")
                    continue
                if s["monitors"]["passed"]:
                    continue
                cb = [c["feature_rates"]["code_block"]["rate"] for c in (c0, c1)]
                tripped = sorted({m for r in s["monitors"]["reasons"] for m in re.findall(r"version \d+: (\w+)", r)})
                ne = (c0["no_edit_rate"], c1["no_edit_rate"])
                lines.append(f"| {n} | {s['seed']} | the monitors: {', '.join(tripped) or 'tripped'} | {r3(ne[0])} -> "
                             f"{r3(ne[1])} ({f(ne[1] - ne[0])}) | {r3(cb[0])} -> {r3(cb[1])} | {s['ab']['decision']} | "
                             f"{s['ab'].get('action', 'n/a')} |")
        old, band = [], []  # the agentic suite's seeds, and those of protocols measured on held-out requests since
        for n in self.order:
            if family(n) != family(SHARED):
                continue
            rates = [c["eval_pass_rate"] for s in self.seeds.get(n, []) for c in s["cycles"]
                     if c.get("eval_pass_rate") is not None]
            (band if self.protos[n][1].held_out else old).extend(rates)
        lines += ["", f"The eval suite's pass rate of the updated policy, highest over the {len(old)} committed "
                      f"shared seeds whose update reached the eval: {max(old):.3f}"]
        if band:
            lines += [f"On the calibrated band (claim 5), in the {len(band)} shared seed(s) since: "
                      f"{', '.join(f'{r:.3f}' for r in band)}"]
        return lines

    def eval_gate(self) -> list[str]:
        """The calibrated band's census, the degraded checkpoint's verdicts and base-vs-base false alarms
        (bench/band_census.py, eval_degraded.py, eval_false_alarm.py; their committed JSON under docs/results/)."""
        path = RESULTS / "band-census-smollm2.json"
        if not path.is_file():
            return ["no census committed"]
        c = json.loads(path.read_text())
        m, rows = c["meta"], c["tasks"]
        band = [r for r in rows if m["low"] <= r["pass_rate"] <= m["high"]]
        lines = [f"Census: {len(rows)} candidates x {m['samples']} samples at T {m['temperature']}, "
                 f"{m['max_tokens']} tokens: {len(band)} tasks passed in 1 to {m['samples'] - 1} of {m['samples']} "
                 f"(kept), {sum(r['passed'] == 0 for r in rows)} never, {sum(r['passed'] == r['samples'] for r in rows)} "
                 f"always; the band's pass rate {sum(r['pass_rate'] for r in band) / len(band):.3f}"]
        deg = RESULTS / "eval-degraded-smollm2.json"
        if deg.is_file():
            d = json.loads(deg.read_text())
            lines += ["", "| weights noise (x each matrix's std) | candidate pass rate | baseline pass rate | diff | "
                      "95% interval | detectable change (80% power) | verdict |", "|---:|---:|---:|---:|---|---:|---|"]
            lines += [f"| {r['sigma']:g} | {r['candidate_mean']:.3f} | {r['baseline_mean']:.3f} | {f(r['mean_diff'])} "
                      f"| {ci(r)} | {r['mde']:.3f} | {r['verdict']} |" for r in d["rows"]]
        fa = RESULTS / "eval-false-alarm-smollm2.json"
        if fa.is_file():
            d = json.loads(fa.read_text())
            for name, v in list(d["comparisons"].items())[:1]:  # the random splits (the disjoint pairs are few)
                lines.append(f"Base against itself, {name}: refused {v['refused']} of {v['comparisons']} "
                             f"({v['rate']:.3f}, Wilson [{v['wilson'][0]:.3f}, {v['wilson'][1]:.3f}]), "
                             f"{v['refused_for_pass_rate']} of them for the pass rate "
                             f"({v['refused_for_pass_rate'] / v['comparisons']:.3f}; nominal {d['meta']['nominal']:.3f} "
                             f"a metric, one-sided); pass rate of these fresh draws {d['pass_rate']:.3f}")
        return lines

    def report(self) -> str:
        out = ["## registered protocols, in the order git added them", *self.registry(), "",
               "## pooled results recomputed", *self.pooled_checks(), "",
               f"## designs before {SHARED}", self.designs_line(SHARED), "",
               f"## {SHARED}", *self.shared(), "",
               f"## designs before {ORG}", self.designs_line(ORG), "",
               f"## {ORG} and every seed of its training", *self.orgs(), "",
               "## what the production checks refused", *self.blocked(), "",
               "## the eval gate", *self.eval_gate()]
        return "\n".join(out) + "\n"


def main() -> int:
    print(Claims().report(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
