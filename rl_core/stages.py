"""The cycle's stage list and the verdicts each path requires: names only, so the gates that read them
(rl_core/registry/gate.py) and the table that names those gates (rl_core/pipeline.py) both import this module
and not each other (tests/test_imports.py counts pipeline.GATES' "module:function" strings as imports).
"""

# The cycle in order (the DAG's task ids without their groups): stages and, between them, the gates (rl_core/pipeline.py GATES).
CYCLE = ("window", "served", "monitors", "rollback", "ab_verdict", "plan", "part", "harvest", "gate_raw",
         "exclude", "gate_episodes", "score", "gate_rewards", "train", "evaluate", "register", "gate_promotion", "deploy",
         "outcome")  # outcome: all_done, the run's one-line outcome (rl_core/outcome.py)
# The org-adapter DAG (realtime_rl_orgs), as chains: from its window, the live adapters' A/B (one per org live_orgs lists)
# beside the orgs that train, both ending at `report` (all_done). Each task runs after the one before it in its chain
# (rl_core.pipeline.check_dag).
ORG_CYCLE = (("window", "org_ab", "report"), ("live_orgs", "org_ab"), ("window", "org_targets", "adapt_org", "report"))
# What must have judged a run, and passed, before its checkpoint may serve anyone.
REQUIRED_VERDICTS = ("gate_raw", "gate_episodes", "gate_rewards", "monitors", "train", "eval")
# An org adapter: the same, and no regression on the org's own tasks.
ADAPTER_VERDICTS = (*REQUIRED_VERDICTS, "eval_org")
# The checks before an update (the org path runs them on its org's run, after its harvest and scoring).
BEFORE_TRAIN = ("gate_raw", "gate_episodes", "gate_rewards", "monitors")
