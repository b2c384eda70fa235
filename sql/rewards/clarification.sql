-- Clarifying questions are fine in moderation: within a session the first
-- max(1, floor(clarification_rate_max * turns)) are free, every clarifying turn beyond that scores 1
-- (the weight is negative), so a policy cannot farm reward by asking instead of answering.
SELECT rn,
    CASE WHEN is_clarifying AND n_asked > greatest(1, floor($clarification_rate_max * n_turns)) THEN 1.0 ELSE 0.0 END
        AS value
FROM (
    SELECT rn, is_clarifying,
        count(*) OVER (PARTITION BY org_id, session_id) AS n_turns,
        sum(is_clarifying::INTEGER) OVER (
            PARTITION BY org_id, session_id ORDER BY turn_index, rn ROWS UNBOUNDED PRECEDING) AS n_asked
    FROM scored
)
