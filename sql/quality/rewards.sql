-- Per-row facts the rewards suite checks.
SELECT
    *,
    isnan(reward) OR isinf(reward) AS reward_not_finite,
    broken_tool_call AND NOT (reward < 0) AS broken_not_negative
FROM read_parquet($path)
