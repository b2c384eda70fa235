"""The A/B step end to end on real MLflow over SQLite: verdict from the aliases, report logged (table +
PNG), verdict applied (promote, then a rollback), `rtrl ab` on the command line."""

from __future__ import annotations

from datetime import timedelta

import pytest
from test_ab_verdict import END, START

from lab.testing import ab_synth
from lab.testing.ab_synth import ArmSpec
from rl_core.ab import verdict
from rl_core.lake import Lake
from rl_core.registry import store


def _write(cfg, start, end, champion, challenger, seed):
    events, feedback = ab_synth.synth_ab(20_000, 2_000, start, end, champion, challenger, seed=seed)
    lake = Lake(cfg.lake_root)
    ab_synth.write_to_lake(lake, "interactions", events)
    ab_synth.write_to_lake(lake, "feedback", feedback)


def test_verdict_report_and_apply(cfg, tmp_path, capsys):
    from rl_core.cli import main

    ckpt = tmp_path / "stand-in"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    v1, v2, v3 = (store.register_checkpoint(cfg, ckpt, run_name=f"r{i}", tags={"run_id": f"r{i}"}) for i in range(3))
    store.set_alias(cfg, "champion", v1, "setup")
    store.set_alias(cfg, "challenger", v2, "setup")

    _write(cfg, START, END, ArmSpec(v1, edit_persisted=0.30), ArmSpec(v2, edit_persisted=0.34), seed=11)
    result = verdict.ab_verdict(cfg, START, END)  # versions from the aliases
    assert (result.champion_version, result.challenger_version) == (v1, v2)
    assert result.decision == "promote", result.reasons

    # report: in the lake and on an MLflow run, reused when the same window is analysed again
    lake = Lake(cfg.lake_root)
    assert result.report_path.endswith(f"ab/{START:%Y%m%dT%H%M%SZ}_{END:%Y%m%dT%H%M%SZ}")
    png = lake.fs.open(f"{result.report_path}/chart.png", "rb").read()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    c = store.client(cfg)
    arts = {a.path for a in c.list_artifacts(result.mlflow_run_id, "ab")}
    assert arts == {"ab/chart.png", "ab/report.md", "ab/report.json"}
    run = c.get_run(result.mlflow_run_id)
    assert run.data.tags["decision"] == "promote"
    assert run.data.metrics["ab/edit_persisted_rate_diff"] > 0
    assert c.get_experiment(run.info.experiment_id).name == f"{cfg.mlflow.experiment}-ab"  # A/B runs apart
    v2_run = c.get_run(store.get_version(cfg, v2).run_id)  # and on the challenger's own run, for comparing
    assert v2_run.data.metrics["ab/edit_persisted_rate_diff"] == pytest.approx(run.data.metrics["ab/edit_persisted_rate_diff"])
    assert store.get_version(cfg, v2).tags["ab.decision"] == "promote"
    assert "| A/B | promote vs v1" in store.get_version(cfg, v2).description
    assert verdict.ab_verdict(cfg, START, END).mlflow_run_id == result.mlflow_run_id

    assert verdict.apply_verdict(cfg, result) == "promote"
    assert store.aliases(cfg) == {"champion": v2}
    assert verdict.apply_verdict(cfg, result) == "stale"  # the analysed challenger is gone: nothing moves
    assert store.aliases(cfg) == {"champion": v2}

    # next window: a slower challenger is rolled back; the champion stays
    store.set_alias(cfg, "challenger", v3, "setup")
    later = (END, END + timedelta(hours=5))
    _write(cfg, *later, ArmSpec(v2, latency_median_ms=800), ArmSpec(v3, latency_median_ms=1100), seed=12)
    assert main(["ab", "--since", later[0].isoformat(), "--until", later[1].isoformat(), "--apply"]) == 0
    out = capsys.readouterr().out
    assert "decision **rollback**" in out and "| latency_p90_ms |" in out and "applied: rollback" in out
    assert store.aliases(cfg) == {"champion": v2}
    assert store.get_version(cfg, v3).tags["rolled_back"] == "true"

    with pytest.raises(SystemExit):
        main(["ab", "--since", "yesterday"])
    assert "'yesterday': expected ISO 8601" in capsys.readouterr().err
