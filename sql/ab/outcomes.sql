-- One row per A/B interaction with its logged outcomes (used by ab.py as the temp table `outcomes`).
-- Inputs: views `interactions` and `feedback` over the lake's raw partitions; parameters
--   $since, $until        the A/B window on ts_request, [since, until)
--   $champion, $challenger the MLflow versions behind each arm (other versions in the window are ignored)
--   $dis_strong, $dis_weak, $dis_positive: the follow-up lexicon of rl_core/rewards/followup.py
--   $w_persisted, $w_reverted, $w_dissatisfied, $w_latency, $w_thumbs, $latency_budget_ms
--                         reward weights (config [rewards]) for the logged reward
-- Duplicates are harmless: interactions are deduplicated by event_id, feedback only enters through
-- bool_or, so a replayed feedback event counts once.
WITH i AS (
    SELECT event_id, user_id, arm, latency_ms
    FROM interactions
    WHERE ts_request >= $since AND ts_request < $until
      AND ((arm = 'champion' AND model_version = $champion)
        OR (arm = 'challenger' AND model_version = $challenger))
    QUALIFY row_number() OVER (PARTITION BY event_id ORDER BY ts_response) = 1
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
