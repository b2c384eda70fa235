-- One row per A/B interaction with its logged outcomes (the temp table `outcomes` of rl_core/ab/verdict.py).
-- Inputs: table `arms` (event_id, user_id, arm, latency_ms: one row per interaction of either arm, from arms.sql
-- or org_arms.sql) and view `feedback` over the lake's raw partitions; parameters
--   $dis_strong, $dis_weak, $dis_positive: the follow-up lexicon of rl_core/rewards/followup.py
--   $w_persisted, $w_reverted, $w_dissatisfied, $w_latency, $w_thumbs, $latency_budget_ms
--                         reward weights (config [rewards]) for the logged reward
-- Duplicates are harmless: `arms` holds each event_id once, feedback only enters through bool_or, so a replayed
-- feedback event counts once.
WITH i AS (
    SELECT event_id, user_id, arm, latency_ms
    FROM arms
),
f AS (
    SELECT
        event_id,
        bool_or(kind = 'edit_persisted') AS persisted,
        bool_or(kind = 'edit_reverted') AS reverted,
        bool_or(kind = 'followup_message' AND (regexp_matches(lower(coalesce(text, '')), $dis_strong) OR (regexp_matches(lower(coalesce(text, '')), $dis_weak) AND NOT regexp_matches(lower(coalesce(text, '')), $dis_positive)))) AS dissatisfied,
        bool_or(kind = 'thumbs' AND value_bool) AS thumbs_up,
        bool_or(kind = 'thumbs' AND NOT value_bool) AS thumbs_down
    FROM feedback
    WHERE event_id IN (SELECT event_id FROM i)
    GROUP BY event_id
)
SELECT
    i.arm,
    i.user_id,
    i.latency_ms,
    (coalesce(f.persisted, false) AND NOT coalesce(f.reverted, false))::INTEGER AS persisted,
    coalesce(f.reverted, false)::INTEGER AS reverted,
    coalesce(f.dissatisfied, false)::INTEGER AS dissatisfied,
    (  $w_persisted * (coalesce(f.persisted, false) AND NOT coalesce(f.reverted, false))::INTEGER
     + $w_reverted * coalesce(f.reverted, false)::INTEGER
     + $w_dissatisfied * coalesce(f.dissatisfied, false)::INTEGER
     + $w_latency * least(coalesce(i.latency_ms, 0) / $latency_budget_ms, 1.0)
     + $w_thumbs * (coalesce(f.thumbs_up, false)::INTEGER - coalesce(f.thumbs_down, false)::INTEGER)
    )::DOUBLE AS reward
FROM i LEFT JOIN f USING (event_id)
