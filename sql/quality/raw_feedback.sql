-- Per-row facts the raw-feedback suite checks, for feedback that arrived in [start, end + grace); of one org
-- when $org_id is set (an org adapter's run), else of every org.
SELECT feedback_id, event_id, org_id, kind,
    coalesce(isnan(value_float) OR isinf(value_float), false) AS value_invalid
FROM feedback
WHERE ts >= $start AND ts < $grace_end
    AND ($org_id::VARCHAR IS NULL OR org_id = $org_id::VARCHAR)
