-- Reward-hacking monitors: rates per model_version, and per org adapter on it (adapter_version NULL: the
-- version itself), over a run's episodes and rewards. rewards.parquet is written in episodes.parquet's row
-- order, so the files are joined by position; n_mismatch counts rows whose event_ids disagree (must be 0,
-- else the files do not belong together). org_id: the adapter's organisation (an adapter serves one org).
SELECT
    e.model_version,
    e.adapter_version,
    min(e.org_id) AS org_id,
    count(*) AS n,
    avg(r.broken_tool_call::DOUBLE) AS broken_tool_rate,
    avg(r.is_clarifying::DOUBLE) AS clarify_rate,
    avg((regexp_matches(lower(coalesce(e.completion_text, '')), $refusal)
         OR (trim(coalesce(e.completion_text, '')) = '' AND coalesce(trim(e.tool_calls), '') IN ('', '[]')))::DOUBLE)
        AS empty_refusal_rate,
    -- no edit: no tool call and no complete fenced code block (prose, a question, nothing, or code cut off
    -- before its closing fence): nothing a user could apply, so nothing to revert
    avg((coalesce(trim(e.tool_calls), '') IN ('', '[]')
         AND NOT regexp_matches(coalesce(e.completion_text, ''), '```[^\n`]*\n(?s:.*?)```'))::DOUBLE) AS no_edit_rate,
    avg(r.reward) AS mean_reward,
    stddev_samp(r.reward) AS reward_std,
    count(*) FILTER (WHERE e.event_id IS DISTINCT FROM r.event_id) AS n_mismatch
FROM read_parquet($episodes) e
POSITIONAL JOIN read_parquet($rewards) r
GROUP BY e.model_version, e.adapter_version
ORDER BY e.model_version, e.adapter_version NULLS FIRST
