"""Pre-registered protocols: a bad file is refused before anything runs; the summary, the pooled test and the
plot say what the registered rule reads; the tiny protocol runs end to end (very slow)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from lab.simulate.experiment import CycleMetrics
from lab.simulate.protocol import env_of, load_protocol, markdown, plot, pooled, seed_summary, set_aside

REPO = Path(__file__).resolve().parent.parent
EXPERIMENTS = REPO / "experiments"  # one folder per question: its protocols, summaries, plots
TINY = EXPERIMENTS / "tiny/tiny.toml"


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "p.toml"
    p.write_text(text)
    return p


def test_every_shipped_protocol_loads(cfg):
    for path in sorted(EXPERIMENTS.glob("*/*.toml")):
        proto = load_protocol(path)
        assert proto.seeds and proto.feature and env_of(proto, proto.seeds[0])["RTRL_SIMULATE__SEED"]


def test_a_bad_protocol_is_refused_naming_what_is_wrong(cfg, tmp_path):
    base = TINY.read_text()
    with pytest.raises(ValueError, match="typo"):
        load_protocol(_write(tmp_path, base.replace("cycles = 2", "cycles = 2\ntypo = 1")))
    with pytest.raises(ValueError, match="protocol.feature 'fstring' is not a preference"):
        load_protocol(_write(tmp_path, base.replace('feature = "code_block"\nprimary', 'feature = "fstring"\nprimary')))
    with pytest.raises(ValueError, match="unknown answer feature 'emoji'"):
        load_protocol(_write(tmp_path, base.replace('preference = { feature = "code_block"',
                                                     'preference = { feature = "emoji"')))
    with pytest.raises(ValueError, match="a \\[protocol\\] table is needed"):
        load_protocol(_write(tmp_path, "[other]\nx = 1\n"))


def test_the_cli_exits_2_on_a_bad_protocol_and_runs_nothing(cfg, tmp_path, capsys):
    from rl_core.cli import main

    rc = main(["experiment", "--protocol", str(_write(tmp_path, "[other]\n")), "--out", str(tmp_path / "out")])
    assert rc == 2 and "a [protocol] table is needed" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _cycle(k: int, rewards: dict[str, float], rate: float, verdicts: dict[str, bool]) -> CycleMetrics:
    n = 40
    fr = {"code_block": {"k": int(rate * n), "n": n, "rate": rate, "ci_low": rate - 0.1, "ci_high": rate + 0.1}}
    return CycleMetrics(k, f"cycle-{k}", 0, n, n, sum(rewards.values()) / len(rewards), 0.1, 0.0, 0.0, 0.0, 0.01,
                        k + 1, {}, {str(k): n}, user_reward=rewards, verdicts=verdicts, feature_rates=fr,
                        user_features={"code_block": {u: rate for u in rewards}}, window=["a", "b"])


def _summary(seed: int, diffs: list[float], commit: str | None = None) -> dict:
    proto = load_protocol(TINY)
    first = {f"u{i}": 0.0 for i in range(len(diffs))}
    last = {f"u{i}": d for i, d in enumerate(diffs)}
    curves = [_cycle(1, first, 0.3, {"eval": True, "monitors": True}), _cycle(2, last, 0.6, {})]
    curves[1].user_features = {"code_block": {u: 0.3 + 0.1 * (i % 3 + 1) for i, u in enumerate(last)}}
    judged = {"monitors": {"passed": True, "reasons": []}, "ab": {"decision": "promote"}}
    return seed_summary(proto, TINY, seed, curves, judged, 12.0, commit)


def test_seed_summary_pairs_users_and_records_every_check(cfg):
    s = _summary(0, [0.1, 0.2, 0.3, 0.2])
    assert s["primary"]["n_users"] == 4 and s["primary"]["diff"] == pytest.approx(0.2)
    assert s["primary"]["excludes_zero"] and s["checks"]["ci_excludes_zero"]
    assert s["checks"] == {"ci_excludes_zero": True, "feature_rises": True, "eval_no_regression": True,
                           "every_dag_ok": True, "monitors_pass": True, "ab_promotes": True}
    assert len(s["protocol_sha256"]) == 64 and s["commit"]
    # the commit a run started on, not the HEAD when it ended (the org-conventions-v7 summary read two commits on)
    assert _summary(0, [0.1, 0.2], commit="0123abc")["commit"] == "0123abc"
    json.dumps(s)  # machine-readable as it is


def test_a_time_limit_is_a_check_of_each_seed(cfg):
    from lab.simulate.protocol import Protocol

    proto = load_protocol(TINY)
    timed = Protocol(**{**proto.model_dump(), "max_minutes": 60.0})
    curves = [_cycle(1, {"u0": 0.0, "u1": 0.0}, 0.3, {"eval": True}), _cycle(2, {"u0": 0.5, "u1": 0.4}, 0.6, {})]
    judged = {"monitors": {"passed": True, "reasons": []}, "ab": {"decision": "promote"}}
    assert seed_summary(timed, TINY, 0, curves, judged, 59.9, "c")["checks"]["within_minutes"] is True
    assert seed_summary(timed, TINY, 0, curves, judged, 62.5, "c")["checks"]["within_minutes"] is False
    assert "within_minutes" not in seed_summary(proto, TINY, 0, curves, judged, 62.5, "c")["checks"]


def test_pooled_rule_needs_enough_seeds_and_a_pooled_interval_above_zero(cfg):
    proto = load_protocol(TINY)
    good = _summary(0, [0.1, 0.2, 0.3, 0.2])
    p = pooled([good], proto)
    assert p["n_users"] == 4 and p["seeds_excluding_zero"] == 1 and p["success"]
    noisy = _summary(0, [0.5, -0.5, 0.4, -0.45])
    p = pooled([noisy], proto)
    assert p["ci_low"] < 0 < p["ci_high"] and not p["success"]
    # the mean of every user's difference, with a t interval over all of them
    both = pooled([good, _summary(1, [0.0, 0.4])], proto)
    assert both["n_users"] == 6 and math.isclose(both["diff"], (0.8 + 0.4) / 6)


def test_table_and_plot_show_every_seed(cfg, tmp_path):
    proto = load_protocol(TINY)
    sums = [_summary(0, [0.1, 0.2, 0.3, 0.2]), _summary(1, [0.5, -0.5, 0.4, -0.45])]
    md = markdown(sums, pooled(sums, proto))
    assert md.count("\n| 0 |") == 1 and md.count("\n| 1 |") == 1 and "pooled over 8 users" in md
    assert "0.300 -> 0.600" in md and "promote" in md
    png = plot(sums, [proto.feature], tmp_path / "curves.png")
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


def test_replay_plot_adds_each_org_adapters_change(tmp_path):
    """A replay protocol's feature panels can show only v1; the plot adds a panel of each org adapter's change
    against v1 (convention, guard, shape) from the summary alone: a seventh panel, so a third row."""
    import struct

    s = json.loads((EXPERIMENTS / "org-conventions/org-conventions-v7-seed16.json").read_text())
    feats = ["summary_first", "code_block", "prose_after_code", "python_fence", "short_answer"]

    def height(summary: dict, name: str) -> int:
        png = plot([summary], feats, tmp_path / name, guard_tolerance=0.05).read_bytes()
        return struct.unpack(">II", png[16:24])[1]  # the PNG's IHDR: width, height

    without = {**s, "orgs": {**s["orgs"], "shape": {}}}
    assert height(s, "replay.png") > height(without, "no-shape.png") * 1.3


@pytest.mark.slow
@pytest.mark.very_slow  # one DAG run and two traffic windows: minutes; `make test-all`
@pytest.mark.timeout(1800)
def test_tiny_protocol_runs_end_to_end_and_writes_its_summary(rtrl_home, tmp_path):
    from rl_core.cli import main

    out = tmp_path / "out"
    rc = main(["experiment", "--protocol", str(TINY), "--out", str(out)])
    s = json.loads((out / "summary-seed0.json").read_text())
    assert rc == 0 and s["checks"]["every_dag_ok"] and len(s["cycles"]) == 2
    assert s["cycles"][0]["verdicts"]["eval"] is not None and s["cycles"][1]["verdicts"] == {}  # measured only
    assert s["ab"]["decision"] in ("promote", "rollback", "continue") and "monitors" in s
    assert set(s["cycles"][1]["feature_rates"]) >= {"code_block", "inline_comment"}
    assert (out / "learning_curves.png").exists() and (out / "results.md").exists()


def test_welch_difference_in_differences():
    from lab.simulate.org_protocol import welch

    w = welch([0.3, 0.2, 0.4, 0.3], [-0.2, -0.1, -0.3, -0.2])
    assert w["diff"] == pytest.approx(0.5) and w["ci_low"] > 0.3 and w["n_a"] == w["n_b"] == 4
    assert welch([0.1], [0.2, 0.3]) is None  # one user is no interval
    noisy = welch([0.5, -0.5, 0.4], [0.3, -0.4, 0.2])
    assert noisy["ci_low"] < 0 < noisy["ci_high"]


def test_an_orgs_protocol_needs_opposite_conventions(cfg, tmp_path):
    text = (EXPERIMENTS / "org-conventions/org-conventions.toml").read_text()
    assert load_protocol(EXPERIMENTS / "org-conventions/org-conventions.toml").dag == "orgs"
    same = text.replace('"org-globex" = { feature = "prose_after_code", want = false }',
                        '"org-globex" = { feature = "prose_after_code", want = true }')
    with pytest.raises(ValueError, match="one org that wants 'prose_after_code' and one that rejects it"):
        load_protocol(_write(tmp_path, same))


def test_a_replay_protocol_must_be_an_orgs_protocol_with_the_replay_test(cfg, tmp_path):
    text = (EXPERIMENTS / "org-conventions/org-conventions-v3.toml").read_text()
    assert load_protocol(EXPERIMENTS / "org-conventions/org-conventions-v3.toml").measure == "replay"
    for bad in (text.replace('primary = "replay_did"', 'primary = "feature_did"'),
                text.replace('measure = "replay"', 'measure = "live"'),
                text.replace("cycles = 2 ", "cycles = 3 ")):
        with pytest.raises(ValueError, match='measure = "replay" goes with primary = "replay_did"'):
            load_protocol(_write(tmp_path, bad))
    live = (EXPERIMENTS / "org-conventions/org-conventions-v2.toml").read_text()
    for bad in (text.replace("[protocol]\n", '[protocol]\nguard = "no_such_feature"\n'),
                live.replace("[protocol]\n", '[protocol]\nguard = "code_block"\n')):
        with pytest.raises(ValueError, match="protocol.guard"):
            load_protocol(_write(tmp_path, bad))


def test_a_seeds_test_is_logged_to_mlflow_where_operators_compare_runs(cfg):
    """The summary's numbers and checks on an MLflow run of their own: what a person compares across protocols."""
    from lab.simulate.protocol import log_summary
    from rl_core.registry import store

    s = _summary(3, [0.1, 0.2, 0.3, 0.2], commit="0123abc")
    s["orgs"] = {"did": {"diff": 0.5, "ci_low": 0.4, "ci_high": 0.7, "n_a": 16},
                 "guard": {"org-acme": {"feature": "writes_code", "mean_rate_change": -0.0625, "ci_low": None}}}
    s["checks"]["guard_kept"] = False
    run = store.client(cfg).get_run(log_summary(cfg, s))
    m, tags = run.data.metrics, run.data.tags
    assert m["protocol/primary/diff"] == pytest.approx(0.2) and m["protocol/did/ci_low"] == pytest.approx(0.4)
    assert m["protocol/guard/org-acme/mean_rate_change"] == pytest.approx(-0.0625)
    assert "protocol/guard/org-acme/ci_low" not in m  # no number, no metric
    assert tags["kind"] == "protocol" and tags["commit"] == "0123abc" and tags["seed"] == "3"
    assert tags["check.guard_kept"] == "false" and tags["check.ci_excludes_zero"] == "true"
    assert tags["all_checks_pass"] == "false"  # one failed check fails the seed
    assert run.info.run_name == f"protocol-{s['protocol']}-seed3"


def _org_seed(seed: int, acme: list[float], globex: list[float], **checks: bool) -> dict:
    """An orgs-protocol seed summary as the replay test writes it (per-user rate changes, each org's move)."""
    from lab.simulate.org_protocol import welch

    users = {f"org-acme-u{i}": d for i, d in enumerate(acme)} | {f"org-globex-u{i}": d for i, d in enumerate(globex)}
    did = welch(acme, globex)
    return {"seed": seed, "checks": {"did_excludes_zero": did["ci_low"] > 0, "each_org_moves_toward_its_convention":
                                     sum(acme) > 0 > sum(globex), "guard_kept": True, "adapters_isolated": True,
                                     **checks},
            "orgs": {"did": did, "user_rate_diffs": users,
                     "org_moves": {"org-acme": {"want": True, "mean_rate_change": sum(acme) / len(acme)},
                                   "org-globex": {"want": False, "mean_rate_change": sum(globex) / len(globex)}}}}


def test_the_pooled_org_rule_pools_every_seeds_users_and_needs_every_other_check():
    from lab.simulate.org_protocol import pooled_orgs

    # two seeds: neither excludes zero alone (4 users an org), together they do (8 an org); ids repeat across seeds
    a = _org_seed(1, [0.25, 0.5, 0.0, 0.25], [0.0, -0.25, 0.25, -0.25])
    b = _org_seed(2, [0.5, -0.25, 0.5, 0.25], [-0.25, 0.25, 0.0, -0.5])
    assert not a["checks"]["did_excludes_zero"] and not b["checks"]["did_excludes_zero"]
    p = pooled_orgs([a, b], "p", [1, 2], 0)
    assert p["n_users"] == 16 and p["diff"] == pytest.approx(0.25 - (-0.09375))
    assert p["ci_low"] > 0 and p["each_org_moves_toward_its_convention"] and p["success"]
    assert not pooled_orgs([a, b], "p", [1, 2], 1)["success"]  # the registered number of seeds must exclude zero
    assert not pooled_orgs([a], "p", [1, 2], 0)["success"]  # a registered seed missing
    leak = _org_seed(2, [0.5, -0.25, 0.5, 0.25], [-0.25, 0.25, 0.0, -0.5], adapters_isolated=False)
    assert not pooled_orgs([a, leak], "p", [1, 2], 0)["success"]  # one seed's failed check fails the rule
    wrong_way = _org_seed(2, [0.5, 0.5, 0.75, 0.5], [0.25, 0.5, 0.25, 0.25])  # globex's adapter moved toward acme's
    assert not pooled_orgs([a, wrong_way], "p", [1, 2], 0)["each_org_moves_toward_its_convention"]
    md = markdown([], p)
    assert "pooled DiD over 16 users of seeds [1, 2]" in md and "success: True" in md
    lone = _org_seed(1, [0.25, 0.5, 0.0, 0.25], [0.0, -0.25, 0.25, -0.25])
    lone["orgs"]["user_rate_diffs"] = {k: v for k, v in lone["orgs"]["user_rate_diffs"].items() if "acme" in k}
    empty = pooled_orgs([lone], "p", [1], 0)  # one org has no users: no interval, no success, still reported
    assert empty["did"] is None and not empty["success"] and "n/a" in markdown([], empty)


def test_the_pooled_rule_is_one_mlflow_run_that_a_rerun_updates(cfg):
    from lab.simulate.org_protocol import pooled_orgs
    from lab.simulate.protocol import log_pooled
    from rl_core.registry import store

    a = _org_seed(1, [0.25, 0.5, 0.0, 0.25], [0.0, -0.25, 0.25, -0.25])
    first = log_pooled(cfg, pooled_orgs([a], "p", [1, 2], 0))  # one seed in: not a success yet
    c = store.client(cfg)
    assert c.get_run(first).data.tags["success"] == "false" and c.get_run(first).data.tags["seeds"] == "1"
    b = _org_seed(2, [0.5, -0.25, 0.5, 0.25], [-0.25, 0.25, 0.0, -0.5])
    pool = pooled_orgs([a, b], "p", [1, 2], 0)
    assert log_pooled(cfg, pool) == first  # the same run, updated
    run = c.get_run(first)
    assert run.info.run_name == "protocol-p-pooled" and run.data.tags["success"] == "true"
    assert run.data.tags["seeds"] == "1,2" and run.data.metrics["protocol/pooled/ci_low"] == pytest.approx(pool["ci_low"])
    assert run.data.metrics["protocol/pooled/n_users"] == 16


def test_seeds_pool_as_a_random_effect_when_they_disagree_more_than_their_users_do():
    from lab.simulate.org_protocol import pooled_orgs, random_effects

    # equal seeds: no between-seed variance, the fixed-effect mean, and a t on k-1 df (wider than the normal's)
    same = random_effects([0.2, 0.2, 0.2], [0.05, 0.05, 0.05])
    assert same["tau"] == 0 and same["diff"] == pytest.approx(0.2)
    assert same["se"] == pytest.approx(0.05 / 3**0.5) and same["ci_low"] < 0.2 - 1.96 * same["se"]
    # seeds that disagree (the six of v10's training ran from +0.02 to +0.35): tau > 0 and an interval far wider
    # than the fixed-effect one (over three times as wide here: its lower bound falls to about zero)
    spread = random_effects([0.02, 0.35, 0.04, 0.21, 0.03, 0.30], [0.06] * 6)
    assert spread["tau"] > 0.1 and spread["diff"] == pytest.approx(0.158, abs=0.01) and spread["seeds"] == 6
    assert spread["ci_high"] - spread["diff"] > 3 * 1.96 * 0.06 / 6**0.5 and spread["ci_low"] < 0.01
    assert random_effects([0.2], [0.05]) is None and random_effects([0.1, 0.2], [0.05, 0.0]) is None
    # the org rule with pool = "seeds_random" judges that interval; the users-pooled one is still reported
    a = _org_seed(1, [0.25, 0.5, 0.0, 0.25], [0.0, -0.25, 0.25, -0.25])
    b = _org_seed(2, [0.5, -0.25, 0.5, 0.25], [-0.25, 0.25, 0.0, -0.5])
    users, seeds = pooled_orgs([a, b], "p", [1, 2], 0), pooled_orgs([a, b], "p", [1, 2], 0, pool="seeds_random")
    assert users["success"] and users["seed_random_effect"] == seeds["seed_random_effect"]
    assert seeds["diff"] == seeds["seed_random_effect"]["diff"] and seeds["ci_low"] < 0 and not seeds["success"]
    assert seeds["did"] == users["did"] and seeds["n_users"] == users["n_users"] == 16
    assert "the seed a random effect, over seeds [1, 2]" in markdown([], seeds) and "on 1 df" in markdown([], seeds)
    assert "n/a (fewer than 2 seeds)" in markdown([], pooled_orgs([a], "p", [1], 0, pool="seeds_random"))


def test_a_seed_restarted_in_a_used_home_runs_from_an_empty_one_and_the_old_is_kept(tmp_path):
    """An aborted start leaves its lake, WAL and registry behind: a restart must not harvest them into its windows."""
    home = tmp_path / "seed-41"
    assert set_aside(home) is None, "nothing there: nothing to move"
    home.mkdir()
    assert set_aside(home) is None, "an empty home is already fresh"
    (home / "lake").mkdir()
    (home / "lake" / "old.parquet").write_bytes(b"rows of the aborted start")
    moved = set_aside(home)
    assert moved is not None and moved.parent == tmp_path and moved.name.startswith("seed-41.aborted-")
    assert not home.exists(), "the seed starts from an empty home"
    assert (moved / "lake" / "old.parquet").read_bytes() == b"rows of the aborted start", "nothing deleted"
