-- Per-row facts the episodes suite checks; org_share is the row's org's share of the run's episodes.
-- $logprob_max is rl_core.schema.LOGPROB_MAX, the bound the gateway enforces.
SELECT
    event_id, org_id, user_id, session_id, model_version, version_lag, credit_weight,
    model_version + version_lag AS policy_version,
    len(completion_token_ids) AS n_completion_tokens,
    len(completion_logprobs) AS n_logprobs,
    len(list_filter(completion_logprobs, lambda x: x > $logprob_max OR isnan(x) OR isinf(x)))
        + len(completion_logprobs) - list_count(completion_logprobs) AS n_bad_logprobs,
    (n_feedback > 0)::DOUBLE AS has_feedback,
    count(*) OVER (PARTITION BY org_id) / count(*) OVER () AS org_share
FROM read_parquet($path)
