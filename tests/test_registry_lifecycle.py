"""Registry lifecycle on real MLflow over SQLite: register runs with lineage, deploy, promote, roll back."""

from __future__ import annotations

import shutil
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
import pytest

from rl_core.artifacts import HarvestResult, TrainSummary
from rl_core.lake import Lake
from rl_core.pipeline import REQUIRED_VERDICTS
from rl_core.reports import Verdict, write_verdict

WINDOW = ("2026-12-02T05:00:00+00:00", "2026-12-02T10:00:00+00:00")


def write_run(cfg, run_id: str, ckpt_src: Path, parent: int, *, failing: str | None = None,
              missing: str | None = None, train_details: dict | None = None, episodes: int = 12) -> Path:
    """The files a cycle leaves for the registry: checkpoint, summary, harvest manifest, episodes, rewards,
    verdicts (all passing unless `failing` / `missing` names one)."""
    lake = Lake(cfg.lake_root)
    ckpt = cfg.models_dir / "runs" / run_id / "checkpoint"
    shutil.copytree(ckpt_src, ckpt)
    lake.write_json(f"runs/{run_id}/train/summary.json", TrainSummary(
        run_id=run_id, checkpoint=str(ckpt), base_version=parent, status="ok", exit_code=0, loss=0.42, kl=0.01,
        kl_max=0.02, steps=3).model_dump())
    lake.write_json(f"runs/{run_id}/harvest.json", asdict(HarvestResult(
        run_id, f"runs/{run_id}/episodes.parquet", WINDOW[0], WINDOW[1], parent, "hour", episodes, episodes, 0,
        episodes, 1, 1)))
    ids = [f"{run_id}-e{i}" for i in range(episodes)]  # each run its own episodes: the ledger refuses reuse
    lake.write_parquet(f"runs/{run_id}/episodes.parquet", pa.table({"event_id": ids}))
    lake.write_parquet(f"runs/{run_id}/rewards.parquet", pa.table({
        "event_id": ids, "reward": [0.5] * episodes, "reward_config_hash": [cfg.rewards.config_hash()] * episodes}))
    for name in REQUIRED_VERDICTS:
        if name == missing:
            continue
        details = {"candidate_pass_rate": 0.5, "baseline_pass_rate": 0.45, "candidate_pass_rate_bugfix": 0.5,
                   "baseline_pass_rate_bugfix": 0.25} if name == "eval" else {}
        if name == "train":
            details = train_details if train_details is not None else {"loss": 0.42, "kl": 0.01}
        bad = name == failing
        write_verdict(lake, run_id, Verdict(name=name, passed=not bad, reasons=[f"{name} planted failure"] if bad else [],
                                            details=details))
    return ckpt


def test_register_two_versions_with_lineage_and_idempotent(registered, tiny_checkpoint):
    from rl_core.registry import store
    from rl_core.registry.register import register_run

    cfg = registered
    _bad_run_files_are_refused(cfg, tiny_checkpoint)
    write_run(cfg, "cycle-a", tiny_checkpoint, parent=1)
    v2 = register_run(cfg, "cycle-a")
    assert v2 == 2
    assert register_run(cfg, "cycle-a") == 2  # same run -> same version, nothing new
    write_run(cfg, "cycle-b", tiny_checkpoint, parent=2, episodes=20)
    v3 = register_run(cfg, "cycle-b")
    assert v3 == 3

    mv = store.get_version(cfg, v3)
    assert mv.tags["run_id"] == "cycle-b"
    assert mv.tags["parent_version"] == "2"
    assert mv.tags["episodes"] == "20"
    assert mv.tags["data_window"] == f"{WINDOW[0]}/{WINDOW[1]}"
    assert mv.tags["reward_config_hash"] == cfg.rewards.config_hash()
    assert mv.tags["verdict.eval"] == "passed"
    run = store.client(cfg).get_run(mv.run_id)
    m = run.data.metrics
    assert m["train/loss_mean"] == pytest.approx(0.42) and m["train/kl_max"] == pytest.approx(0.02)
    assert m["reward/mean"] == pytest.approx(0.5) and m["reward/n"] == 20
    assert m["eval/pass_rate"] == pytest.approx(0.5) and m["eval/parent_pass_rate"] == pytest.approx(0.45)
    assert m["eval/delta_pass_rate_bugfix"] == pytest.approx(0.25)
    prefixes = {k.split("/")[0] for k in m}
    # one prefix per source, no bare names; _decide/* repeats the deciding numbers under names that sort first
    assert prefixes <= {"train", "reward", "eval", "_decide"}, sorted(m)
    assert not any(k.startswith(("train_", "eval_", "summary/")) for k in m)
    c = store.client(cfg)
    arts = {a.path for sub in ("eval", "verdicts", "charts") for a in c.list_artifacts(mv.run_id, sub)}
    assert {"verdicts/eval.json", "verdicts/train.json", "charts/reward_hist.png", "charts/eval_deltas.png"} <= arts
    desc = mv.description
    assert "| parent | v2 |" in desc and "| episodes | 20 |" in desc and "bugfix +0.250" in desc, desc
    assert "eval ✓" in desc and "+0.500 ± 0.000" in desc
    v1 = store.get_version(cfg, 1)
    assert v1.tags["parent_version"] == "none" and "none (base model)" in v1.description
    assert (store.checkpoint_path(cfg, v3) / "config.json").is_file()
    assert store.aliases(cfg) == {"champion": 1}  # registering never moves an alias


def _bad_run_files_are_refused(cfg, tiny_checkpoint):
    """Bad run files -> RegisterError naming the file/field, and no version is created."""
    from rl_core.registry import store
    from rl_core.registry.register import RegisterError, register_run

    with pytest.raises(RegisterError, match="summary"):
        register_run(cfg, "cycle-none")
    with pytest.raises(RegisterError, match="plain name"):
        register_run(cfg, "x' or name='y")
    write_run(cfg, "cycle-x", tiny_checkpoint, parent=1)
    lake = Lake(cfg.lake_root)
    lake.write_json("runs/cycle-x/train/summary.json", TrainSummary(
        run_id="cycle-x", status="ok", exit_code=0, base_version=1, checkpoint="/nonexistent/ckpt").model_dump())
    with pytest.raises(RegisterError, match="checkpoint folder"):
        register_run(cfg, "cycle-x")
    lake.write_json("runs/cycle-x/train/summary.json", {"base_version": "one"})
    with pytest.raises(RegisterError, match="base_version"):
        register_run(cfg, "cycle-x")
    lake.write_json("runs/cycle-x/train/summary.json", TrainSummary(
        run_id="cycle-x", status="ok", exit_code=0, base_version=1).model_dump())
    lake.write_json("runs/cycle-x/harvest.json", {"start": WINDOW[0]})  # not a harvest's manifest
    with pytest.raises(RegisterError, match="harvest.json: lacks"):
        register_run(cfg, "cycle-x")
    versions = store.client(cfg).search_model_versions(f"name='{cfg.mlflow.model_name}'")
    assert [int(v.version) for v in versions] == [1]


def test_deploy_promote_rollback_round_trip(registered, tiny_checkpoint, capsys):
    from rl_core.cli import main
    from rl_core.registry import promote, store
    from rl_core.registry.deploy import deploy
    from rl_core.registry.register import register_run

    cfg = registered
    write_run(cfg, "cycle-a", tiny_checkpoint, parent=1)
    v2 = register_run(cfg, "cycle-a")
    assert deploy(cfg, "cycle-a", v2) is True
    assert store.aliases(cfg) == {"champion": 1, "challenger": 2}
    assert deploy(cfg, "cycle-other", v2) is False  # a version only deploys with its own run's verdicts

    assert promote.promote(cfg, "A/B: edit_persisted better", expected=2) == 2
    assert store.aliases(cfg) == {"champion": 2}
    mv = store.get_version(cfg, 2)
    assert "edit_persisted" in mv.tags["alias.champion.set_reason"] and mv.tags["alias.champion.previous"] == "1"
    assert "promoted_at" in mv.tags and not any(k.count(".") > 2 or k[-1].isdigit() for k in mv.tags), mv.tags
    assert "`champion` set: promote: A/B: edit_persisted better" in mv.description  # history, under the table
    with pytest.raises(promote.RegistryError, match="challenger"):
        promote.promote(cfg, "nothing to promote")

    # the same steps from the command line
    write_run(cfg, "cycle-b", tiny_checkpoint, parent=2)
    assert main(["deploy", "--run-id", "cycle-b"]) == 1  # not registered yet
    assert main(["register", "--run-id", "cycle-b"]) == 0
    assert "version 3 <- run cycle-b" in capsys.readouterr().out
    assert main(["deploy", "--run-id", "cycle-b"]) == 0
    assert main(["promote", "--expected", "2"]) == 1  # stale: the challenger is 3 now
    assert "refusing a stale move" in capsys.readouterr().err
    assert store.aliases(cfg) == {"champion": 2, "challenger": 3}
    assert main(["promote", "--expected", "3", "--reason", "A/B again"]) == 0
    assert [m.version for m in promote.history(cfg)] == [1, 2, 3]

    # one command restores the previous champion; the demoted version never comes back by rollback
    assert main(["rollback", "--reason", "bad edits in prod"]) == 0
    assert "champion <- version 2" in capsys.readouterr().out
    assert store.aliases(cfg) == {"champion": 2}
    assert store.get_version(cfg, 3).tags["rolled_back"] == "true"
    assert main(["rollback"]) == 0
    assert store.aliases(cfg)["champion"] == 1  # skips 3 (rolled back), lands on 1
    assert main(["rollback"]) == 1  # 2 and 3 are rolled back: nothing left to restore, nothing moves
    assert store.aliases(cfg) == {"champion": 1}

    write_run(cfg, "cycle-c", tiny_checkpoint, parent=1)
    v4 = register_run(cfg, "cycle-c")
    assert deploy(cfg, "cycle-c", v4)
    assert main(["rollback", "--challenger"]) == 0
    assert store.aliases(cfg) == {"champion": 1}
    assert store.get_version(cfg, v4).tags["rolled_back"] == "true"


def test_serving_router_follows_deploy_promote_and_rollback(registered, tiny_checkpoint):
    """The gateway's auto router, polling the real registry, serves what the alias moves say."""
    from rl_core.registry import promote, store
    from rl_core.registry.deploy import deploy
    from rl_core.registry.register import register_run
    from rl_core.serving.backends import make_backend
    from rl_core.serving.router import Router

    cfg = registered
    router = Router(
        factory=lambda ckpt, version: make_backend("transformers", ckpt, cfg, version),
        checkpoint_for=lambda version: store.checkpoint_path(cfg, version),
        alias_source=lambda: store.aliases(cfg),
        challenger_share=cfg.serving.challenger_share,
        model_name=cfg.mlflow.model_name,
    )
    router.start(background=False)
    try:
        assert router.versions() == {"champion": 1}
        write_run(cfg, "cycle-a", tiny_checkpoint, parent=1)
        v2 = register_run(cfg, "cycle-a")
        assert deploy(cfg, "cycle-a", v2)
        assert router.sync()  # what the poller does every serving.alias_poll_s
        assert router.versions() == {"champion": 1, "challenger": v2}
        leases = [router.route("auto", f"user-{i}") for i in range(2000)]
        share = sum(lease.version == v2 for lease in leases) / len(leases)
        for lease in leases:
            lease.release()
        assert abs(share - cfg.serving.challenger_share) < 0.03

        promote.promote(cfg, "A/B promote", expected=v2)
        router.sync()
        assert router.versions() == {"champion": v2}
        promote.restore_previous_champion(cfg, "incident")
        router.sync()
        assert router.versions() == {"champion": 1}
        lease = router.route("auto", "anyone")
        assert lease.version == 1
        lease.release()
    finally:
        router.close()
