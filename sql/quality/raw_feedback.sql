-- Per-row facts the raw-feedback suite checks, for feedback that arrived in [start, end + grace).
SELECT feedback_id, event_id, org_id, kind,
    coalesce(isnan(value_float) OR isinf(value_float), false) AS value_invalid
FROM feedback
WHERE ts >= $start AND ts < $grace_end
