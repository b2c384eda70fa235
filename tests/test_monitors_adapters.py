"""An org's live LoRA adapter is a model of its own: the monitors judge its turns against the version it served on
(not mixed into that version's rates), and a live adapter that games the reward is taken off its org's traffic."""

from __future__ import annotations

import json
from datetime import timedelta

from lab.testing.synth import interaction_row, window
from rl_core.harvest import harvest
from rl_core.lake import Lake
from rl_core.rewards import score_run
from rl_core.rewards.monitors import run_monitors, version_rates
from rl_core.schema import to_table

START, END = window()
FIX = "Here is the fix:\n```python\ndef f(n):\n    return list(range(n))\n```"
ASK = "Which file do you mean, and could you share the full traceback?"


def window_with_adapter(cfg, name: str, run_id: str = "run-a") -> None:
    """Version 1 answers with code for org-globex and, through org-acme's adapter `name`, mostly asks back."""
    t = START + timedelta(minutes=5)
    own = [interaction_row(t, org_id="org-globex", completion_text=FIX, session_id=f"g{i}") for i in range(30)]
    adapted = [interaction_row(t, org_id="org-acme", adapter_version=name, session_id=f"a{i}",
                               completion_text=FIX if i < 6 else ASK) for i in range(30)]
    Lake(cfg.lake_root).write_partition("interactions", START, to_table("interactions", own + adapted))
    harvest(cfg, START, END, 1, run_id)
    score_run(cfg, run_id)


def test_a_gaming_adapter_trips_the_monitors_and_stays_out_of_its_versions_rates(cfg):
    window_with_adapter(cfg, "org-acme-v3-0123abcd")
    assert version_rates(cfg, "run-a")[1]["clarify_rate"] == 0.0  # the adapter's turns are not version 1's own
    v = run_monitors(cfg, "run-a", parent_version=1)
    assert not v.passed and v.details["tripped"] == []  # no version tripped: the adapter did
    assert v.details["tripped_adapters"] == [{"adapter_version": "org-acme-v3-0123abcd", "org_id": "org-acme",
                                              "version": 1}]
    assert any(r.startswith("adapter org-acme-v3-0123abcd (org org-acme, on version 1): clarify_rate")
               for r in v.reasons), v.reasons
    assert v.details["adapters"]["org-acme-v3-0123abcd"]["n"] == 30


def test_an_adapter_answering_like_its_version_passes(cfg):
    t = START + timedelta(minutes=5)
    rows = [interaction_row(t, org_id=org, adapter_version=name, completion_text=FIX, session_id=f"{org}{i}")
            for org, name in (("org-globex", None), ("org-acme", "org-acme-v1-feedbeef")) for i in range(30)]
    Lake(cfg.lake_root).write_partition("interactions", START, to_table("interactions", rows))
    harvest(cfg, START, END, 1, "run-b")
    score_run(cfg, "run-b")
    v = run_monitors(cfg, "run-b", parent_version=1)
    assert v.passed and v.details["tripped_adapters"] == [] and "org-acme-v1-feedbeef" in v.details["adapters"]


def test_the_rollback_takes_a_tripped_live_adapter_off_its_orgs_traffic(registered, tmp_path):
    from rl_core.orgs.registry import LIVE_ALIAS, adapter_registry, live_adapter, register_adapter_folder
    from rl_core.registry import promote, store

    cfg = registered
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"r": 4}))
    (folder / "adapter_model.safetensors").write_bytes(b"weights")
    av = register_adapter_folder(cfg, "org-acme", folder, {"parent_version": 1, "run_id": "manual"})
    acfg = adapter_registry(cfg, "org-acme")
    store.set_alias(acfg, LIVE_ALIAS, av.version, reason="test: live")
    window_with_adapter(cfg, av.adapter_version)
    v = run_monitors(cfg, "run-a", parent_version=1)
    assert not v.passed

    assert "would be taken off traffic" in promote.take_off_tripped(cfg, v, dry_run=True)
    assert live_adapter(cfg, "org-acme").version == av.version  # a dry run moves nothing
    said = promote.take_off_tripped(cfg, v)
    assert f"adapter {av.adapter_version} of org-acme taken off traffic" in said, said
    assert live_adapter(cfg, "org-acme") is None
    assert store.get_version(acfg, av.version).tags[promote.ROLLED_BACK] == "true"
    assert store.aliases(cfg) == {"champion": 1}  # the shared policy's aliases are not touched
    assert promote.take_off_tripped(cfg, v) == "nothing to take off traffic"  # already off: nothing again
