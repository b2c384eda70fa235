-- One org's interactions, and only the columns the A/B reads (rl_core/ab/org.py materialises this as the table
-- `interactions`, so no later query of the analysis can see another org's rows). Input: view `lake_interactions`
-- over the window's raw partitions; parameter $org.
SELECT event_id, org_id, user_id, arm, model_version, adapter_version, ts_request, ts_response, latency_ms
FROM lake_interactions
WHERE org_id = $org
