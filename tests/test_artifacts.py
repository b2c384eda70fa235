"""Typed run artifacts (issue 42): Lake.read_harvest hands back the HarvestResult the harvest wrote.

The type lives below the stages (rl_core/artifacts.py), so the lake reads it without importing the harvest (and
DuckDB); tests/test_imports.py checks that no import cycle came with it.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from datetime import timedelta

import pytest

from lab.testing.synth import interaction_row, window
from rl_core.artifacts import HarvestResult, TrainSummary
from rl_core.harvest import HarvestResult as FromHarvest
from rl_core.harvest import harvest
from rl_core.lake import Lake
from rl_core.outcome import skip_reason
from rl_core.schema import to_table

START, END = window()


def test_read_harvest_is_what_the_harvest_returned(cfg):
    lake = Lake(cfg.lake_root)
    assert FromHarvest is HarvestResult, "one declaration, imported under both names"
    assert lake.read_harvest("run-a") is None, "no harvest yet"
    row = interaction_row(START + timedelta(hours=1), model_version=4, org_id="org-acme")
    lake.write_partition("interactions", row["ts_request"], to_table("interactions", [row]))
    r = harvest(cfg, START, END, 4, "run-a")
    got = lake.read_harvest("run-a")
    # the manifest spells the episodes as a lake path; the rest is the result as returned
    assert got == replace(r, path=lake.run("run-a").episodes)
    assert (got.policy_version, got.n_episodes, got.org_id, got.skip_reason()) == (4, 1, None, None)


def test_a_manifest_with_more_keys_reads_and_one_with_fewer_is_named(cfg):
    lake = Lake(cfg.lake_root)
    full = HarvestResult(run_id="run-b", path="p", start=START.isoformat(), end=END.isoformat(), policy_version=2,
                         granularity="hour", n_interactions=0, n_episodes=0, n_stale=0, n_with_feedback=0,
                         n_interaction_files=0, n_feedback_files=0)
    # the settings the harvest ran under and what `rtrl exclude` adds are the file's, not the result's
    lake.write_json(lake.run("run-b").manifest, asdict(full) | {"grace_hours": 6.0, "quarantined_orgs": ["org-x"]})
    assert lake.read_harvest("run-b") == full
    assert skip_reason(cfg, "run-b").startswith("no traffic in [")
    lake.write_json(lake.run("run-b").manifest, {"start": "a", "end": "b", "policy_version": 2})
    with pytest.raises(ValueError, match=r"runs/run-b/harvest.json: lacks run_id, path, granularity"):
        lake.read_harvest("run-b")
    assert skip_reason(cfg, "run-b") is None, "another release's manifest: no reason rather than a crash"


def test_read_train_summary_is_the_type_the_trainer_wrote(cfg):
    """One type for the training result: what `rtrl train` writes is what the registry and the org path read back;
    no summary yet is None, and a file that is not one names its field (no dict, no alternative key spellings)."""
    from pydantic import ValidationError

    lake = Lake(cfg.lake_root)
    assert lake.read_train_summary("cycle-t") is None
    written = TrainSummary(run_id="cycle-t", status="ok", exit_code=0, base_version=3, kl=0.01, loss=float("nan"))
    lake.write_json(lake.run("cycle-t").train_summary, written.model_dump(mode="json"))
    read = lake.read_train_summary("cycle-t")
    assert read == written and read.loss is None and read.base_version == 3  # non-finite metrics read as unknown
    lake.write_json(lake.run("cycle-t").train_summary, {"checkpoint_dir": "/x", "parent_version": 3})
    with pytest.raises(ValidationError, match="base_version"):
        lake.read_train_summary("cycle-t")
