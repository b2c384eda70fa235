-- Per-row facts the episodes suite checks; org_share is the row's org's share of the run's episodes.
-- bad_logprobs() is the contract's logprob rule (rl_core.schema.BAD_LOGPROBS_SQL), the gateway's too.
SELECT
    event_id, org_id, user_id, session_id, model_version, version_lag, credit_weight,
    model_version + version_lag AS policy_version,
    len(completion_token_ids) AS n_completion_tokens,
    len(completion_logprobs) AS n_logprobs,
    bad_logprobs(completion_logprobs) AS n_bad_logprobs,
    (n_feedback > 0)::DOUBLE AS has_feedback,
    count(*) OVER (PARTITION BY org_id) / count(*) OVER () AS org_share
FROM read_parquet($path)
