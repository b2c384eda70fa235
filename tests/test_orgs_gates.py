"""Org adapters pass the cycle's own checks (rl_core/pipeline.py): the data-quality gates on the org's episodes
and rewards, and the reward-hacking monitors on what the window served the org's users, before any update;
and the verdicts the cycle requires, before an adapter goes live. Before, adapt_org went from harvest straight
to training, and an adapter went live on train + eval + eval_org alone."""

from __future__ import annotations

import pytest

from lab.testing.synth import ArmSpec, Defects, generate, window
from rl_core.harvest import harvest
from rl_core.lake import Lake
from rl_core.orgs.branch import adapt_org, org_targets
from rl_core.orgs.pipeline import OrgRun, org_run_id
from rl_core.orgs.registry import deploy_adapter, live_adapter
from rl_core.pipeline import ADAPTER_VERDICTS, REQUIRED_VERDICTS
from rl_core.reports import GateFailed, Verdict, read_verdict, write_verdict

START, END = window()
RUN = "cyc-gates"
ORGS = ("org-acme", "org-globex")


def test_an_org_served_by_a_hacking_version_gets_no_adapter(registered):
    from rl_core.registry import store

    cfg = registered
    v2 = store.register_checkpoint(cfg, store.checkpoint_path(cfg, 1), run_name="hacky", tags={"parent_version": 1})
    store.set_alias(cfg, "challenger", v2, "test: deployed")
    generate(400, START, END, seed=6, lake=Lake(cfg.lake_root), orgs=ORGS,
             arms=(ArmSpec(share=0.5), ArmSpec(name="challenger", model_version=v2, share=0.5, tool_p=0.4,
                                               broken_tool_p=0.5)))
    harvest(cfg, START, END, 1, RUN)
    org = org_targets(cfg, RUN)[0]
    with pytest.raises(GateFailed, match="monitors failed") as refused:
        adapt_org(cfg, START, END, 1, RUN, org)
    assert refused.value.verdict.details["tripped"] == [v2]
    orun = org_run_id(RUN, org)
    lake = Lake(cfg.lake_root)
    assert all(read_verdict(lake, orun, g).passed for g in ("gate_raw", "gate_episodes", "gate_rewards"))
    assert not (cfg.models_dir / "runs" / orun).exists()  # the trainer never started
    assert live_adapter(cfg, org) is None


def test_an_org_with_defective_episodes_is_refused_by_the_data_gates(registered):
    cfg = registered
    generate(200, START, END, seed=3, lake=Lake(cfg.lake_root), orgs=ORGS, arms=(ArmSpec(share=1.0),),
             defects=Defects(positive_logprobs=6))
    harvest(cfg, START, END, 1, RUN)
    org = org_targets(cfg, RUN)[0]
    with pytest.raises(GateFailed, match="gate_raw failed"):
        adapt_org(cfg, START, END, 1, RUN, org)
    assert not (cfg.models_dir / "runs" / org_run_id(RUN, org)).exists()


def test_an_adapter_goes_live_only_with_every_verdict_the_cycle_requires(registered):
    cfg = registered
    lake = Lake(cfg.lake_root)
    orun = org_run_id(RUN, "org-acme")
    assert set(REQUIRED_VERDICTS) < set(ADAPTER_VERDICTS)
    for name in ("train", "eval", "eval_org"):  # what used to be enough
        write_verdict(lake, orun, Verdict(name=name, passed=True))
    assert deploy_adapter(cfg, OrgRun.of(cfg, START, END, 1, RUN, "org-acme"), 1) is False  # no data gates, no monitors: refused
    assert live_adapter(cfg, "org-acme") is None
