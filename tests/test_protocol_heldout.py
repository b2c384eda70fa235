"""Protocols that measure what users would see (issue 43): held-out tasks and new users in the measured cycle,
a baseline cycle of v1 that trains nothing, band tasks asked by simulated users, per-request outcomes and the
per-user rate of edits persisting in the summary, guards as non-inferiority tests, old protocol files unchanged.

The protocol run here is the real one (lab.simulate.protocol.run_seed -> run_experiment -> the simulator's
users, raters and sandboxed hidden tests), with the gateway, the DAG and the judging replaced by fakes that
answer in-process: the test is about which requests reach which cycle, not about serving or training."""

from __future__ import annotations

import json
import random
import tomllib
import uuid
from collections import Counter
from pathlib import Path

import pytest

from lab.simulate import heldout, outcomes
from lab.simulate.bank import load_bank
from lab.simulate.experiment import CycleMetrics, Paired
from lab.simulate.hacks import scripted_text
from lab.simulate.protocol import Protocol, env_of, load_protocol, pooled, seed_summary
from lab.simulate.users import Reply
from rl_core import toolcalls

REPO = Path(__file__).resolve().parent.parent
EXPERIMENTS = REPO / "experiments"  # one folder per question: its protocols and summaries
TINY = EXPERIMENTS / "tiny/tiny.toml"
BAND = "{repo}/bench/band"
NEW_FIELDS = {"bank": "", "heldout": 0.0, "split_seed": None, "new_users": False, "baseline": False,
              "rate_share": 1.0, "flip": 0.0, "noninferior": [], "guard_test": "point", "measure_users": None,
              "measure_interactions": None}


def _write(tmp_path: Path, extra: str, base: Path = TINY, **replace: str) -> Path:
    """tiny.toml with extra lines in its [protocol] table and `old=new` replacements (keyword: a label)."""
    text = base.read_text().replace("[protocol]\n", "[protocol]\n" + extra, 1)
    for old, new in replace.values():
        text = text.replace(old, new)
    p = tmp_path / "p.toml"
    p.write_text(text)
    return p


def test_the_split_is_seeded_stratified_and_disjoint():
    band = heldout.load_named_bank(BAND, [])
    a, b = heldout.split_bank(band, 0.25, 7), heldout.split_bank(list(reversed(band)), 0.25, 7)
    assert sorted(a.heldout_ids) == sorted(b.heldout_ids)  # the file's order does not matter
    assert a.heldout_ids != heldout.split_bank(band, 0.25, 8).heldout_ids  # the seed does
    assert not set(a.train_ids) & set(a.heldout_ids) and len(a.train) + len(a.heldout) == len(band)
    kinds, held = Counter(t.task.kind for t in band), Counter(t.task.kind for t in a.heldout)
    assert set(held) == set(kinds)
    for kind, n in kinds.items():  # every kind held out in the registered share, within rounding
        assert abs(held[kind] - 0.25 * n) <= 0.5, kind
    own = load_bank()  # the simulator's bank: an org's own tasks are strata of their own (by kind)
    s = heldout.split_bank(own, 0.3, 0)
    acme = [t for t in s.heldout if t.org == "org-acme"]  # its 2 feature tasks: one held out
    assert len(acme) == 1 and acme[0].task.kind == "feature"
    assert not [t for t in s.heldout if t.org == "org-globex"]  # a feature and a bugfix: strata of one, trained
    assert s.heldout and all(t.org is None or t.org == "org-acme" for t in s.heldout)
    assert heldout.split_bank(own, 0.0, 0).heldout == []


def test_band_tasks_become_simulator_tasks_with_their_target_and_an_answer():
    band = heldout.load_named_bank(BAND, [])
    t = next(x for x in band if x.id == "band-bugfix-add-all")
    assert t.target == "tally.py" == t.task.target and t.answer == "it is in tally.py, just make it work"
    assert t.org is None and not t.hard and any(x.hard for x in band)  # `moderate` band tasks count as hard
    w = next(x for x in band if x.task.kind == "write_test")
    assert w.target == w.task.target and w.target.startswith("test_")  # not the first non-test file
    own = next(x for x in load_bank() if x.id == "sim-add")  # the simulator's own: as before
    assert own.target == "mathx.py" and own.answer == "it is in mathx.py, just make it work"


def _has_runs(path) -> bool:
    """A protocol with a committed summary and none of the held-out fields: written before them, run as written
    (protocols registered since, e.g. shared-preference-v6, set them and are checked by their own runs)."""
    table = tomllib.loads(path.read_text())["protocol"]
    return not set(table) & set(NEW_FIELDS) and any(path.stem + "-seed" in f.name
                                                    for f in path.parent.glob("*-seed*.json"))


def test_an_old_protocol_file_loads_with_identical_effective_settings(cfg):
    old = [p for p in sorted(EXPERIMENTS.glob("*/*.toml")) if _has_runs(p) or p.stem == "tiny"]
    assert len(old) >= 15
    for path in old:
        table = tomllib.loads(path.read_text())["protocol"]
        proto = load_protocol(path)
        assert {k: getattr(proto, k) for k in NEW_FIELDS} == NEW_FIELDS, path
        assert {k: v for k, v in proto.model_dump().items() if k in table} == table, path
        plans, design = heldout.plans(proto.design, proto.cycles, proto.measure_last, proto.seeds[0], [])
        default = [heldout.CyclePlan("measured" if proto.measure_last and k == proto.cycles else "train")
                   for k in range(1, proto.cycles + 1)]  # run_experiment's plans when given none
        assert plans == default and design["heldout_tasks"] is None and not proto.held_out, path
        env = env_of(proto, proto.seeds[0])
        assert set(env) == {f"RTRL_{s.upper()}__{k.upper()}" for s, ks in proto.config.items() for k in ks} | {
            "RTRL_SIMULATE__SEED", "RTRL_SIMULATE__USERS", "RTRL_SERVING__CHALLENGER_SHARE"}, path


def test_held_out_options_that_do_not_go_together_are_refused(cfg, tmp_path):
    ok = load_protocol(_write(tmp_path, f'bank = "{BAND}"\nheldout = 0.25\nbaseline = true\nnew_users = true\n'
                                        'rate_share = 0.3\nflip = 0.15\n'))
    assert ok.held_out and ok.design.rate_share == 0.3 and ok.design.bank == BAND
    one_task = ("conventions = {}", 'conventions = {}\ntasks = ["sim-add"]')
    for extra, match, replace in (
            ("new_users = true\n", "new_users needs baseline", {}),
            ("baseline = true\n", "baseline needs heldout", {}),
            ("heldout = 0.3\n", "measure_last = true", {"m": ("measure_last = true", "measure_last = false")}),
            ('bank = "{repo}/no/such/folder"\n', "protocol.bank", {}),
            ("heldout = 1.0\n", "heldout", {}),
            ("flip = 0.5\n", "flip", {}),
            ("rate_share = 0\n", "rate_share", {}),
            ('noninferior = ["no_such_metric"]\n', "protocol.noninferior", {}),
            ('guard_test = "noninferiority"\n', "judges protocol.guard", {}),
            ("heldout = 0.5\n", "held-out part of the bank has no task for the users of", {"t": one_task})):
        with pytest.raises(ValueError, match=match):
            load_protocol(_write(tmp_path, extra, **replace))


class _BandChat:
    """Answers a band task: the reference fix for two of three sessions, a failing code block for the third."""

    def __init__(self, bank):
        self.prompts = sorted(bank, key=lambda t: -len(t.task.prompt))  # the longest prompt that matches

    def __call__(self, user, session_id, turn, messages, tools, seed):
        first = messages[0]["content"].lower()
        task = next(t for t in self.prompts if t.task.prompt.lower().rstrip(".!") in first)
        text = scripted_text("oracle", task) if seed % 3 else "```python\ndef broken():\n    return None\n```"
        content, calls = toolcalls.parse(text)
        return Reply(str(uuid.UUID(int=random.Random(seed).getrandbits(128))), content, calls, 20.0 + seed % 7, 1)


def _fake_stack(monkeypatch, served: list[dict]):
    """run_experiment's gateway, DAG, metrics and MLflow replaced: each cycle is only the simulator's traffic,
    which `served` records (what the DAG would have been asked to do, who asked what)."""
    from lab.cycle import CycleReport
    from lab.simulate import experiment, protocol
    from lab.simulate.runner import SimSpec, simulate

    bank = heldout.load_named_bank(BAND, [])

    def run_cycle(cfg, interactions=None, log_dir=None, run_dag=True, **_):
        log_dir.mkdir(parents=True)
        k = len(served) + 1
        spec = SimSpec.from_config(cfg, interactions=interactions, rate=1000.0, concurrency=2)
        rep = simulate(cfg, spec=spec, chat=_BandChat(bank), post=lambda u, e: None, progress=False)
        served.append({"run_dag": run_dag, "tasks": {r["task_id"] for r in rep.requests},
                       "users": {r["user_id"] for r in rep.requests}})
        return CycleReport(f"run-{k}", f"2026-01-0{k}T00:00:00+00:00", f"2026-01-0{k}T01:00:00+00:00", 0,
                           rep.interactions, seconds={"traffic": 1.0})

    def metrics(cfg, k, report):
        return CycleMetrics(k, report.run_id, report.dag_rc, report.interactions, report.interactions, 0.0, None,
                            None, None, None, None, None, {}, {"1": report.interactions},
                            seconds=dict(report.seconds), window=[report.start, report.end])

    for name, fake in {"run_cycle": run_cycle, "cycle_metrics": metrics, "init": lambda *a, **k: None,
                       "print_report": lambda *a: None, "train_base": lambda cfg, train_from: None, "stop": lambda *a: None, "airflow_env": lambda cfg: {},
                       "log_mlflow": lambda *a, **k: "rid", "plot": lambda curves, path: path}.items():
        monkeypatch.setattr(experiment, name, fake)
    monkeypatch.setattr(experiment.gw, "start_gateway", lambda *a, **k: (None, "http://127.0.0.1:9"))
    monkeypatch.setattr(experiment.warm, "start_server", lambda *a, **k: (None, None))
    monkeypatch.setattr(experiment.warm, "stop_server", lambda *a, **k: None)
    monkeypatch.setattr(protocol, "judge_last", lambda cfg, curves, ab_test=True: {
        "monitors": {"passed": True, "reasons": []}, "ab": {"decision": "promote", "metrics": {
            "edit_persisted_rate": {"champion": 0.5, "challenger": 0.6, "diff": 0.1, "lo": -0.1, "hi": 0.3}}}})
    monkeypatch.setattr(protocol, "log_summary", lambda cfg, summary: "rid")


@pytest.mark.timeout(600)
def test_held_out_tasks_and_new_users_reach_only_the_measured_cycle_and_its_v1_baseline(
        cfg, tmp_path, monkeypatch):
    from lab.simulate.protocol import run_seed

    path = _write(tmp_path, f'bank = "{BAND}"\nheldout = 0.25\nbaseline = true\nnew_users = true\nrate_share = 0.3\n'
                            'flip = 0.15\nnoninferior = ["dissatisfied_rate", "writes_code"]\nguard_tolerance = 0.5\n')
    text = path.read_text().replace('primary = "mean_reward"', 'primary = "edit_persisted_rate"')
    path.write_text(text.replace("interactions = 24", "interactions = 12"))
    proto = load_protocol(path)
    served: list[dict] = []
    _fake_stack(monkeypatch, served)
    s = run_seed(proto, path, 0, tmp_path / "home", tmp_path / "out")

    design = s["design"]
    held, train = set(design["heldout_tasks"]), set(design["train_tasks"])
    new = set(design["heldout_users"])
    assert held and train and not held & train and design["baseline"] and design["rate_share"] == 0.3
    assert [c["role"] for c in s["cycles"]] == ["baseline", "train", "measured"]
    assert [c["run_dag"] for c in served] == [False, True, False]  # nothing trains on the baseline's window
    baseline, trained, measured = served
    assert trained["tasks"] and not trained["tasks"] & held and not trained["users"] & new  # never seen
    assert baseline["tasks"] <= held and measured["tasks"] <= held and baseline["users"] == measured["users"] == new
    assert all(r["heldout"] and r["new_user"] for r in s["requests"]["last"]) and len(s["requests"]["last"]) == 12
    assert {r["user_id"] for r in s["requests"]["first"]} == new  # the baseline: v1, the same new users
    assert sum(r["thumbs_dropped"] for r in s["requests"]["last"]) > 0  # sparse raters
    # the primary: each user's rate of edits persisting, measured cycle - baseline, paired
    assert s["primary_metric"] == "edit_persisted_rate" and s["primary"]["n_users"] == 4
    rates = s["outcomes"]["per_user"]["edit_persisted_rate"]
    assert set(rates["last"]) == new and s["primary_user_diffs"] == pytest.approx(
        {u: rates["last"][u] - rates["first"][u] for u in new})
    assert set(s["outcomes"]["paired"]) >= {"edit_persisted_rate", "dissatisfied_rate", "latency_ms", "writes_code"}
    assert "feature_rises" not in s["checks"] and {"noninferior_dissatisfied_rate", "noninferior_writes_code"} <= set(s["checks"])
    assert s["ab_outcomes"]["edit_persisted_rate"]["diff"] == 0.1
    assert set(s["phases"]) >= {"experiment_s", "judge_s", "cycles"} and s["cycles"][0]["seconds"]["traffic"] == 1.0
    assert json.loads((tmp_path / "out" / "summary-seed0.json").read_text())["design"] == design


def _paired(lo: float, hi: float) -> Paired:
    return Paired(20, 0.5, 0.5 + (lo + hi) / 2, (lo + hi) / 2, (hi - lo) / 4, lo, hi)


def test_a_guard_passes_only_when_the_ci_bound_clears_the_tolerance():
    assert outcomes.noninferior(_paired(-0.04, 0.10), 0.05)
    assert not outcomes.noninferior(_paired(-0.08, 0.10), 0.05)  # the CI crosses -tolerance
    assert not outcomes.noninferior(_paired(-0.07, 0.03), 0.05)  # a point estimate of -0.02 is not enough
    assert outcomes.noninferior(_paired(-0.10, 0.04), 0.05, higher_is_better=False)  # a rate that must not rise
    assert not outcomes.noninferior(_paired(-0.10, 0.06), 0.05, higher_is_better=False)
    assert not outcomes.noninferior(None, 0.05)


def _records(users: dict[str, list[bool]]) -> list[dict]:
    return [{"user_id": u, "task_id": f"t{i}", "outcome": "edit_passed" if ok else "edit_failed", "edit_persisted": ok,
             "edit_reverted": not ok, "dissatisfied": not ok, "followup": None if ok else "still broken",
             "thumbs": [], "thumbs_dropped": 0, "thumbs_flipped": 0, "latency_ms": 10.0,
             "features": ["writes_code"] if ok else []}
            for u, oks in users.items() for i, ok in enumerate(oks)]


def test_the_summary_judges_a_guard_on_its_ci_and_the_primary_on_edits_persisting(cfg):
    proto = Protocol(**{**load_protocol(TINY).model_dump(), "primary": "edit_persisted_rate",
                        "noninferior": ["edit_persisted_rate"], "guard_tolerance": 0.05})
    first = {f"u{i}": [True, False, True, False] for i in range(6)}
    # +0.5 for half the users, -0.25 for the other half: a mean of +0.125 whose CI reaches far below -0.05
    small = {f"u{i}": [True, True, True, True] if i % 2 == 0 else [True, False, False, False] for i in range(6)}
    steady = {f"u{i}": [True, True, True, False] for i in range(6)}  # +0.25 for everyone
    judged = {"monitors": {"passed": True, "reasons": []}, "ab": {"decision": "promote"}}

    def summary(last: dict) -> dict:
        curves = [CycleMetrics(k, f"c{k}", 0, 24, 24, 0.0, None, None, None, None, None, None, {}, {},
                               requests=_records(r), window=["a", "b"]) for k, r in ((1, first), (2, last))]
        return seed_summary(proto, TINY, 0, curves, judged, 1.0, "c")

    wide, sure = summary(small), summary(steady)
    assert wide["primary"]["diff"] == pytest.approx(0.125)  # positive: a point guard would pass it
    assert wide["outcomes"]["paired"]["edit_persisted_rate"]["ci_low"] < -0.05
    assert wide["checks"]["noninferior_edit_persisted_rate"] is False and not wide["checks"]["ci_excludes_zero"]
    assert sure["checks"]["noninferior_edit_persisted_rate"] is True
    pool = pooled([sure, {**wide, "seed": 1}], proto)  # the seeds' per-user differences of the primary, together
    assert pool["n_users"] == 12 and pool["diff"] == pytest.approx((0.25 + 0.125) / 2)
    assert sure["outcomes"]["first"]["edit_persisted_rate"]["rate"] == 0.5
    assert sure["outcomes"]["requests_two_proportion"]["edit_persisted_rate"]["diff"] == pytest.approx(0.25)


def test_the_primary_can_be_the_feature_rate_measured_from_the_answers(cfg):
    """With sparse raters the reward sees few thumbs; the feature's per-user rate is read from every answer."""
    proto = Protocol(**{**load_protocol(TINY).model_dump(), "primary": "feature_rate", "feature": "writes_code"})
    judged = {"monitors": {"passed": True, "reasons": []}, "ab": {"decision": "promote"}}
    first = {f"u{i}": [True, False, False, False] for i in range(6)}
    last = {f"u{i}": [True, True, True, False] for i in range(6)}
    curves = [CycleMetrics(k, f"c{k}", 0, 24, 24, 0.0, None, None, None, None, None, None, {}, {},
                           requests=_records(r), window=["a", "b"]) for k, r in ((1, first), (2, last))]
    s = seed_summary(proto, TINY, 0, curves, judged, 1.0, "c")
    assert s["primary_metric"] == "feature_rate" and s["primary"]["diff"] == pytest.approx(0.5)
    assert s["checks"]["ci_excludes_zero"] and "feature_rises" not in s["checks"]


def test_the_replay_guard_can_be_a_non_inferiority_test_and_always_reports_one(cfg):
    from lab.simulate.org_protocol import replay_summary
    from lab.simulate.replay import Answer
    from rl_core.config import Preference

    cfg.simulate.conventions = {"org-acme": Preference(feature="prose_after_code", want=True),
                                "org-globex": Preference(feature="prose_after_code", want=False)}
    answers = []
    for u in range(4):
        for org in ("org-acme", "org-globex"):
            user = f"{org}-u{u}"
            lost = org == "org-globex" and u == 0  # one user of globex loses the code: mean -0.25, CI far below
            answers += [Answer(f"{user}-e0", user, org, "base", 0, 1, None, {"prose_after_code": False, "code_block": True}),
                        Answer(f"{user}-e0", user, org, "adapter", 0, 1, f"{org}-v1-a",
                               {"prose_after_code": org == "org-acme", "code_block": not lost})]
    point = replay_summary(cfg, "prose_after_code", answers, [], guard="code_block", guard_tolerance=0.3)
    assert point["checks"]["guard_kept"] is True and "guard_noninferior" not in point["checks"]  # -0.25 > -0.3
    assert point["guard"]["org-globex"]["noninferior"] is False  # ...but its CI reaches below -0.3
    ni = replay_summary(cfg, "prose_after_code", answers, [], guard="code_block", guard_tolerance=0.3,
                        guard_test="noninferiority")
    assert ni["checks"]["guard_noninferior"] is False and "guard_kept" not in ni["checks"]
