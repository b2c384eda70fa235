"""Per-organisation specialisation: a LoRA adapter per org on top of the champion (see docs/orgs.md).

pipeline.py  per-org episodes (harvest filtered to the org, data rights applied), LoRA training through the
             cycle's trainer, paired evals on the shared suite and on the org's own tasks
tasks.py     the org's eval tasks: shared tasks whose hidden tests also check the org's conventions
registry.py  MLflow registered model `rtrl-adapter-<org>`, org lineage, never-reused adapter names, `live` alias
branch.py    what the orgs DAG maps over: org_targets (who has enough data), adapt_org (one org end to end)
serving.py   the gateway's AdapterPool: an org's token is answered by its live adapter (vLLM multi-LoRA in its
             base's engine, or peft-merged on the transformers backend)
"""
