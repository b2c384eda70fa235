-- Harvest bookkeeping: interactions in [start, end) (of $org_id when it is set); how many of them the
-- data-rights view `excluded` (opted-out orgs, forget requests) removes; and how many the ledger removes:
-- within max_staleness of the policy, not excluded, but already consumed by another run of the policy's
-- lineage (view `consumed`, rl_core/ledger.py; $run_id's own episodes stay: a rerun keeps them).
-- Stale = window - episodes - excluded - consumed.
SELECT
    count(*) AS n_window,
    count(*) FILTER (WHERE is_excluded) AS n_excluded,
    count(*) FILTER (WHERE NOT is_excluded AND in_range AND is_consumed) AS n_consumed
FROM (
    SELECT
        EXISTS (
            SELECT 1 FROM excluded x
            WHERE x.org_id = i.org_id AND (x.user_id IS NULL OR x.user_id = i.user_id)
        ) AS is_excluded,
        $policy_version - i.model_version BETWEEN 0 AND $max_staleness AS in_range,
        EXISTS (SELECT 1 FROM consumed c WHERE c.event_id = i.event_id AND c.run_id <> $run_id) AS is_consumed
    FROM interactions i
    WHERE ts_request >= $start AND ts_request < $end
      AND ($org_id IS NULL OR i.org_id = $org_id)
)
