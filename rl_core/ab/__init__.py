"""A/B analysis of the champion and challenger arms on logged outcomes, and of an org's adapter against its base.

`verdict` (ab_verdict, decide, apply_verdict), `org` (org_ab_verdict, apply_org_verdict: one org's adapter on its
own traffic), `result` (the metrics, non-inferiority, the result types), `stats` (clustered intervals, CUPED,
cluster bootstrap), `report` (markdown, PNG, MLflow). Aliases are moved only by rl_core.registry.promote, which
apply_verdict calls (apply_org_verdict through rl_core.orgs.registry).
"""
