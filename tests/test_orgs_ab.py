"""Per-org A/B of an org's LoRA adapter against its base version (rl_core/ab/org.py; docs/orgs.md, "Per-org A/B"):
the share split on the real serving path (tiny model, peft adapter), the verdict over a temporary lake with real
DuckDB reading the org's rows and nothing else, and `rtrl ab --org` end to end on MLflow over SQLite."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import numpy as np
import openai
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from test_ab_verdict import END, START

from lab.testing import ab_synth
from lab.testing.ab_synth import ArmSpec
from rl_core.ab.org import apply_org_verdict, org_ab_verdict
from rl_core.ab.verdict import apply_verdict
from rl_core.lake import Lake
from rl_core.orgs.registry import (
    LIVE_ALIAS,
    AdapterVersion,
    adapter_registry,
    live_adapter,
    register_adapter_folder,
)
from rl_core.orgs.serving import in_adapter_arm
from rl_core.registry import store
from rl_core.schema import FEEDBACK_SCHEMA
from rl_core.serving.router import user_bucket

ACME = AdapterVersion(org_id="org-acme", model_name="rtrl-adapter-org-acme", version=1,
                      adapter_version="org-acme-v1-0123abcd", path="", base_version=1)


def _set(t: pa.Table, name: str, column) -> pa.Table:
    if not isinstance(column, (pa.Array, pa.ChunkedArray)):
        column = pa.array([column] * t.num_rows, t.schema.field(name).type)
    return t.set_column(t.schema.get_field_index(name), name, column)


def org_log(org: str, adapter_name: str, base: ArmSpec, adapter: ArmSpec, n: int, users: int, seed: int,
            start=START, end=END, **kw) -> tuple[pa.Table, pa.Table]:
    """One org's traffic as the gateway logs it: every turn on the base version through the router's champion arm,
    those of the adapter's users answered by the adapter (adapter_version set), the others by the base alone."""
    events, feedback = ab_synth.synth_ab(n, users, start, end, base, adapter, orgs=(org,), seed=seed, **kw)
    treated = pc.equal(events["arm"], "challenger")
    events = _set(events, "adapter_version", pc.if_else(treated, pa.scalar(adapter_name), pa.scalar(None, pa.string())))
    events = _set(events, "arm", "champion")
    return _set(events, "model_version", base.version), feedback


def write(lake: Lake, tag: str, events: pa.Table, feedback: pa.Table | None = None) -> None:
    ab_synth.write_to_lake(lake, "interactions", events, tag=tag)
    if feedback is not None:
        ab_synth.write_to_lake(lake, "feedback", feedback, tag=tag)


def test_only_the_orgs_rows_enter_its_verdict(cfg):
    """Another org in the same window (same base version, the same adapter name and user ids, the opposite effect,
    a pre-period CUPED would read), feedback of that org naming this org's events, and this org's rows the A/B
    leaves out (pinned, another version, another adapter) change nothing of the verdict."""
    lake = Lake(cfg.lake_root)
    acme, acme_fb = org_log("org-acme", ACME.adapter_version, ArmSpec(1, edit_persisted=0.30),
                            ArmSpec(1, edit_persisted=0.38), 6_000, 600, seed=31)
    write(lake, "acme", acme, acme_fb)
    alone = org_ab_verdict(cfg, "org-acme", START, END, adapter=ACME, cuped=True, log=False)
    treated = int(pc.sum(acme["adapter_version"].is_valid()).as_py())
    assert alone.n == {"champion": acme.num_rows - treated, "challenger": treated}
    assert alone.decision == "promote", alone.reasons
    assert (alone.org_id, alone.base_version, alone.adapter_version) == ("org-acme", 1, ACME.adapter_version)

    globex, globex_fb = org_log("org-globex", ACME.adapter_version, ArmSpec(1, edit_persisted=0.6, dissatisfied=0.02),
                                ArmSpec(1, edit_persisted=0.05, dissatisfied=0.6, latency_median_ms=4000), 6_000, 600,
                                seed=32, pre_hours=24, pre_n=3_000)
    write(lake, "globex", globex, globex_fb)
    ids = acme["event_id"].to_pylist()
    hostile = pa.table({
        "feedback_id": [str(uuid.uuid4()) for _ in ids], "event_id": ids, "org_id": ["org-globex"] * len(ids),
        "ts": [END - timedelta(minutes=1)] * len(ids), "kind": ["edit_reverted"] * len(ids),
        "value_bool": pa.nulls(len(ids), pa.bool_()), "value_float": pa.nulls(len(ids), pa.float64()),
        "text": pa.nulls(len(ids), pa.string())}).cast(FEEDBACK_SCHEMA)
    write(lake, "hostile", acme.slice(0, 0), hostile)
    left_out = []
    for i, change in enumerate(({"arm": "pinned"}, {"model_version": 2}, {"adapter_version": "org-acme-v0-deadbeef"})):
        rows = acme.slice(i * 500, 500)
        rows = _set(rows, "event_id", pa.array([str(uuid.uuid4()) for _ in range(rows.num_rows)]))
        for name, value in change.items():
            rows = _set(rows, name, value)
        left_out.append(rows)
    write(lake, "left-out", pa.concat_tables(left_out))

    mixed = org_ab_verdict(cfg, "org-acme", START, END, adapter=ACME, cuped=True, log=False)
    assert (mixed.n, mixed.users, mixed.decision, mixed.reasons) == (alone.n, alone.users, alone.decision, alone.reasons)
    for name, m in alone.metrics.items():
        got = mixed.metrics[name]
        assert (got.diff, got.lo, got.hi, got.champion) == pytest.approx((m.diff, m.lo, m.hi, m.champion), rel=1e-9)
    # the check can fail: globex's own verdict on the same adapter name is the opposite
    other = org_ab_verdict(cfg, "org-globex", START, END, adapter=replace(ACME, org_id="org-globex"), log=False)
    assert other.decision == "rollback" and other.n["challenger"] > 0


def test_the_split_is_stable_salted_and_of_the_configured_share():
    users = [f"user-{i:05d}" for i in range(4_000)]
    arm = np.array([in_adapter_arm("org-acme", u, 0.3) for u in users])
    assert 0.27 < arm.mean() < 0.33
    assert [in_adapter_arm("org-acme", u, 0.3) for u in users[:300]] == arm[:300].tolist()  # stable per user
    # independent of the champion/challenger split and of another org's: agreement as chance has it (0.58), not 1
    for other in (np.array([user_bucket(u) < 0.3 for u in users]),
                  np.array([in_adapter_arm("org-globex", u, 0.3) for u in users])):
        assert 0.54 < np.mean(arm == other) < 0.62
    assert all(in_adapter_arm("org-acme", u, 1.0) for u in users[:100])  # the default: every user (as before)
    assert not any(in_adapter_arm("org-acme", u, 0.0) for u in users[:100])
    assert all(in_adapter_arm("org-acme", u, 0.6) for u, a in zip(users, arm, strict=True) if a)  # a larger share adds


def test_share_is_checked_when_the_config_loads(tmp_path):
    from rl_core.config import REPO_ROOT, ConfigError, load_config

    env = {"RTRL_PROFILE": "tiny", "RTRL_HOME": str(tmp_path)}
    assert load_config(REPO_ROOT / "rtrl.toml", environ=env).orgs.ab_share == 1.0
    with pytest.raises(ConfigError, match=r"env: \[orgs\] ab_share: .*less than or equal to 1 \(got 1.5\)"):
        load_config(REPO_ROOT / "rtrl.toml", environ={**env, "RTRL_ORGS__AB_SHARE": "1.5"})


def ask(base_url: str, token: str, user: str, model: str = "auto") -> dict:
    client = openai.OpenAI(base_url=base_url + "/v1", api_key=token, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "rename the helper"}], temperature=0, max_tokens=4,
        user=user)
    return dict(raw.headers)


def test_a_share_of_the_orgs_users_gets_the_adapter_on_the_real_serving_path(registered, tmp_path):
    from test_orgs_serving import make_adapter

    from rl_core.serving.server import build_gateway, serve_in_thread

    cfg = registered
    cfg.orgs.ab_share = 0.5
    av = register_adapter_folder(cfg, "org-acme", make_adapter(store.checkpoint_path(cfg, 1), tmp_path / "a1", 1),
                                 {"parent_version": 1, "run_id": "manual-a1"})
    store.set_alias(adapter_registry(cfg, "org-acme"), LIVE_ALIAS, av.version, reason="test")
    users = [f"dev-{i}" for i in range(10)]
    want = {u: in_adapter_arm("org-acme", u, 0.5) for u in users}
    assert 0 < sum(want.values()) < len(users)  # both arms among these users
    since = datetime.now(timezone.utc) - timedelta(minutes=1)
    gw = build_gateway(cfg, poll=False)
    with serve_in_thread(cfg, gateway=gw) as url:
        got = {u: ask(url, "rtrl-acme-token", u).get("x-rtrl-adapter-version") for u in users}
        again = {u: ask(url, "rtrl-acme-token", u).get("x-rtrl-adapter-version") for u in users[:3]}
        globex = [ask(url, "rtrl-globex-token", u).get("x-rtrl-adapter-version") for u in users[:3]]
        pinned = ask(url, "rtrl-acme-token", next(u for u in users if want[u]), model=f"{cfg.mlflow.model_name}/1")
    assert got == {u: av.adapter_version if want[u] else None for u in users}
    assert again == {u: got[u] for u in users[:3]} and globex == [None] * 3  # stable; another org: untouched
    assert "x-rtrl-adapter-version" not in pinned

    # the logged rows say which (adapter_version set or null), and the org's A/B reads them as its two arms
    r = org_ab_verdict(cfg, "org-acme", since, datetime.now(timezone.utc) + timedelta(minutes=1), log=False)
    treated = sum(want.values())
    assert r.n == {"champion": len(users) - treated + (3 - sum(want[u] for u in users[:3])),
                   "challenger": treated + sum(want[u] for u in users[:3])}
    assert r.decision == "continue" and "min_samples_per_arm" in r.reasons[0]


def _adapter_folder(tmp_path, name: str):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text("{}")
    (folder / "adapter_model.safetensors").write_bytes(name.encode())  # stand-in weights: the name's hash
    return folder


def test_rtrl_ab_org_judges_reports_and_applies(cfg, tmp_path, capsys, monkeypatch):
    from rl_core.cli import main

    acfg = adapter_registry(cfg, "org-acme")
    av = register_adapter_folder(cfg, "org-acme", _adapter_folder(tmp_path, "a1"),
                                 {"parent_version": 1, "run_id": "manual-a1"})
    store.set_alias(acfg, LIVE_ALIAS, av.version, reason="test")
    lake = Lake(cfg.lake_root)
    write(lake, "acme", *org_log("org-acme", av.adapter_version, ArmSpec(1, edit_persisted=0.30),
                                 ArmSpec(1, edit_persisted=0.38), 6_000, 600, seed=41))
    write(lake, "globex", *org_log("org-globex", "org-globex-v1-00000000", ArmSpec(1), ArmSpec(1), 2_000, 200, seed=42))
    monkeypatch.setenv("RTRL_AB__GUARDRAIL_MARGINS", '{"dissatisfied_rate": 0.05, "latency_p90_ms": 250}')
    window = ["--since", START.isoformat(), "--until", END.isoformat()]

    assert main(["ab", "--org", "org-acme", *window, "--apply"]) == 0
    out = capsys.readouterr().out
    assert "decision **promote**" in out and f"org-acme's adapter {av.adapter_version}" in out
    assert "| guardrail | margin |" in out and "applied: promote" in out
    c = store.client(cfg)
    runs = c.search_runs([store.experiment_id(cfg, "ab")], filter_string="tags.org = 'org-acme'")
    assert [r.info.run_name for r in runs] == ["ab-org-acme-20261202T0500-20261202T1000"]
    run = runs[0].data
    assert run.tags["decision"] == "promote" and run.tags["adapter_version"] == av.adapter_version
    assert run.tags["ab_window"] == f"orgs/org-acme/{START:%Y%m%dT%H%M%SZ}_{END:%Y%m%dT%H%M%SZ}"
    assert run.metrics["ab/latency_p90_ms_margin"] == 250 and run.metrics["ab/latency_p90_ms_noninferior"] == 1
    assert run.metrics["_decide/guardrails_noninferior"] == 1 and run.metrics["ab/n_challenger"] > 0
    report = json.loads(lake.fs.open(lake.path("ab", run.tags["ab_window"], "report.json")).read())
    assert report["org_id"] == "org-acme" and report["metrics"]["dissatisfied_rate"]["noninferior"] is True
    mv = store.get_version(acfg, av.version)
    assert mv.tags["ab.decision"] == "promote" and "ab.kept_live_at" in mv.tags and "kept live: org A/B" in mv.description
    assert live_adapter(cfg, "org-acme").version == av.version  # promote keeps it live

    # next window: the adapter's users are more dissatisfied -> rollback takes it off the org's traffic
    later = (END, END + timedelta(hours=5))
    write(lake, "acme-later", *org_log("org-acme", av.adapter_version, ArmSpec(1, dissatisfied=0.10),
                                       ArmSpec(1, dissatisfied=0.25), 6_000, 600, seed=43, start=later[0], end=later[1]))
    assert main(["ab", "--org", "org-acme", "--since", later[0].isoformat(), "--until", later[1].isoformat(),
                 "--apply"]) == 0
    assert "applied: rollback" in capsys.readouterr().out
    assert live_adapter(cfg, "org-acme") is None
    assert store.get_version(acfg, av.version).tags["rolled_back"] == "true"
    # the first window's verdict judged an adapter that is no longer live: applying it again moves nothing
    first = org_ab_verdict(cfg, "org-acme", START, END, log=False, adapter=av)
    assert first.decision == "promote" and apply_org_verdict(cfg, first) == "stale"
    with pytest.raises(ValueError, match="apply_org_verdict"):
        apply_verdict(cfg, first)  # an org's verdict never moves the policy's aliases

    # bad input: an org no token serves, a malformed org id
    assert main(["ab", "--org", "org-nobody", *window]) == 2
    assert "--org 'org-nobody'" in capsys.readouterr().err
    assert main(["ab", "--org", "org acme;", *window]) == 2
    assert "--org" in capsys.readouterr().err
