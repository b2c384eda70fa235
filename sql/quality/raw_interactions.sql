-- Per-row facts the raw-interactions suite checks (rl_core/quality/gates.py), for [start, end); of one org
-- when $org_id is set (an org adapter's run), else of every org. bad_logprobs() is the
-- contract's logprob rule (rl_core.schema.BAD_LOGPROBS_SQL), the gateway's too.
-- Every column but event_id is a per-row fact, so gate_raw can tell whose rows break a check (its quarantine).
SELECT
    event_id, org_id, user_id, session_id, turn_index, model_version, arm,
    len(completion_token_ids) AS n_completion_tokens,
    len(completion_logprobs) AS n_logprobs,
    bad_logprobs(completion_logprobs) AS n_bad_logprobs,
    coalesce(isnan(latency_ms) OR isinf(latency_ms) OR latency_ms < 0, false) AS latency_invalid,
    ts_response >= ts_request AS ts_ordered
FROM interactions
WHERE ts_request >= $start AND ts_request < $end
    AND ($org_id::VARCHAR IS NULL OR org_id = $org_id::VARCHAR)
