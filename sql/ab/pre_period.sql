-- CUPED covariate: each user's edit-persisted and dissatisfied follow-up rates before the A/B
-- window, over every arm and version ([pre_since, since) on ts_request). The pre-period is untouched
-- by the treatment, so subtracting its explained part lowers variance without biasing the difference.
-- Parameters: $pre_since, $since, $dis_strong, $dis_weak, $dis_positive.
WITH i AS (
    SELECT event_id, user_id
    FROM interactions
    WHERE ts_request >= $pre_since AND ts_request < $since
    QUALIFY row_number() OVER (PARTITION BY event_id ORDER BY ts_response) = 1
),
f AS (
    SELECT
        event_id,
        bool_or(kind = 'edit_persisted') AND NOT bool_or(kind = 'edit_reverted') AS persisted,
        bool_or(kind = 'followup_message' AND (regexp_matches(lower(coalesce(text, '')), $dis_strong) OR (regexp_matches(lower(coalesce(text, '')), $dis_weak) AND NOT regexp_matches(lower(coalesce(text, '')), $dis_positive)))) AS dissatisfied
    FROM feedback
    WHERE event_id IN (SELECT event_id FROM i)
    GROUP BY event_id
)
SELECT
    i.user_id,
    count(*)::DOUBLE AS n_pre,
    avg(coalesce(f.persisted, false)::INTEGER)::DOUBLE AS persisted_pre,
    avg(coalesce(f.dissatisfied, false)::INTEGER)::DOUBLE AS dissatisfied_pre
FROM i LEFT JOIN f USING (event_id)
GROUP BY i.user_id
