"""A/B analysis of the champion and challenger arms on logged outcomes.

`verdict` (ab_verdict, apply_verdict), `stats` (clustered intervals, CUPED, cluster bootstrap), `report`
(markdown, PNG, MLflow). Aliases are moved only by rl_core.registry.promote, which apply_verdict calls.
"""
