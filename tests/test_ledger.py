"""The ledger of consumed episodes (rl_core/ledger.py): an episode trains at most once per policy lineage.

Real DuckDB harvests over a synthetic lake, real MLflow over SQLite for the registry's lineage; the whole
overlap case through Airflow is in tests/test_dag_operator_view.py.
"""

from __future__ import annotations

import shutil
from datetime import timedelta

import pytest
from test_registry_lifecycle import write_run

from lab.testing.synth import ArmSpec, generate, window
from rl_core.harvest import harvest
from rl_core.lake import Lake

START, END = window()


def traffic(cfg, n: int = 24, seed: int = 7) -> None:
    generate(n, START, END, seed=seed, lake=Lake(cfg.lake_root), arms=(ArmSpec(name="champion", model_version=1,
                                                                               share=1.0),),
             orgs=tuple(cfg.simulate.orgs), grace_hours=cfg.harvest.grace_hours)


def episode_ids(cfg, run_id: str) -> set[str]:
    return set(Lake(cfg.lake_root).read_parquet(f"runs/{run_id}/episodes.parquet").column("event_id").to_pylist())


def test_lineage_is_the_root_of_the_parent_chain(registered, tiny_checkpoint):
    from rl_core.ledger import Lineage, lineage_of
    from rl_core.registry import store

    cfg = registered
    v2 = store.register_checkpoint(cfg, tiny_checkpoint, run_name="a", tags={"parent_version": 1})
    v3 = store.register_checkpoint(cfg, tiny_checkpoint, run_name="b", tags={"parent_version": v2})
    other = store.register_checkpoint(cfg, tiny_checkpoint, run_name="c", tags={"parent_version": ""})
    model = cfg.mlflow.model_name
    assert [lineage_of(cfg, v) for v in (1, v2, v3)] == [Lineage(model, 1)] * 3
    assert lineage_of(cfg, other) == Lineage(model, other)  # a new base starts its own ledger


def test_harvest_leaves_out_other_runs_consumed_episodes_but_a_rerun_keeps_its_own(registered):
    from rl_core.ledger import consume, lineage_of

    cfg = registered
    traffic(cfg)
    family = lineage_of(cfg, 1)
    wide = harvest(cfg, START - timedelta(hours=1), END + timedelta(hours=1), 1, "manual-run", lineage=family)
    assert wide.n_episodes == 24 and wide.n_consumed == 0 and wide.skip_reason() is None
    consume(cfg, "manual-run", version=2, parent_version=1)  # what registering its version does
    first = Lake(cfg.lake_root).read_parquet("runs/manual-run/episodes.parquet")

    again = harvest(cfg, START - timedelta(hours=1), END + timedelta(hours=1), 1, "manual-run", lineage=family)
    assert again.n_episodes == 24  # its own episodes: the rerun is the same run
    assert Lake(cfg.lake_root).read_parquet("runs/manual-run/episodes.parquet").equals(first)

    sched = harvest(cfg, START, END, 1, "scheduled-run", lineage=family)  # the overlapping scheduled window
    assert (sched.n_interactions, sched.n_episodes, sched.n_consumed, sched.n_stale) == (24, 0, 24, 0)
    assert sched.consumed_by == [{"run_id": "manual-run", "version": 2, "n": 24}]
    reason = sched.skip_reason()
    assert reason and "already trained on" in reason and "run manual-run (v2, 24)" in reason, reason

    served = harvest(cfg, START, END, 1, "scheduled-run-served")  # no lineage (the monitors): every turn
    assert served.n_episodes == 24 and served.n_consumed == 0


def test_new_episodes_in_an_overlapping_window_still_train(registered):
    from rl_core.ledger import consume, lineage_of

    cfg = registered
    traffic(cfg, n=12, seed=3)
    family = lineage_of(cfg, 1)
    harvest(cfg, START, END, 1, "early", lineage=family)
    consume(cfg, "early", version=2, parent_version=1)
    old = episode_ids(cfg, "early")
    traffic(cfg, n=12, seed=4)  # more traffic lands in the same window
    later = harvest(cfg, START, END, 1, "later", lineage=family)
    assert later.n_episodes == 12 and later.n_consumed == 12 and later.skip_reason() is None
    assert not episode_ids(cfg, "later") & old


def test_an_empty_window_is_a_skip_with_its_reason(registered):
    from rl_core.ledger import lineage_of

    cfg = registered
    r = harvest(cfg, START, END, 1, "empty", lineage=lineage_of(cfg, 1))
    assert r.n_interactions == 0 and "no traffic" in r.skip_reason()


def test_registering_consumes_and_a_second_run_on_the_same_episodes_is_refused(registered, tiny_checkpoint):
    from rl_core.ledger import EpisodesConsumed, Lineage
    from rl_core.registry.register import find_version, register_run

    cfg = registered
    lake = Lake(cfg.lake_root)
    ledger_dir = Lineage(cfg.mlflow.model_name, 1).relpath
    write_run(cfg, "cycle-a", tiny_checkpoint, parent=1)
    assert lake.list_files(ledger_dir) == []  # trained and judged, not registered: nothing consumed yet
    v2 = register_run(cfg, "cycle-a")
    (path,) = lake.list_files(ledger_dir)
    assert path.endswith("/cycle-a.parquet")
    consumed = lake.read_parquet(f"{ledger_dir}/cycle-a.parquet")
    assert set(consumed.column("event_id").to_pylist()) == episode_ids(cfg, "cycle-a")
    assert set(consumed.column("version").to_pylist()) == {v2}
    assert register_run(cfg, "cycle-a") == v2 and len(lake.list_files(ledger_dir)) == 1  # rerun: idempotent

    # a sibling (same champion) and a descendant (from the new version) that harvested the same episodes
    for run_id, parent in (("cycle-b", 1), ("cycle-c", v2)):
        write_run(cfg, run_id, tiny_checkpoint, parent=parent)
        shutil.copy(lake.path("runs/cycle-a/episodes.parquet"), lake.path(f"runs/{run_id}/episodes.parquet"))
        with pytest.raises(EpisodesConsumed, match=r"12 of its episodes were already trained on .* cycle-a \(12\)"):
            register_run(cfg, run_id)
        assert find_version(cfg, run_id) is None
    assert len(lake.list_files(ledger_dir)) == 1
