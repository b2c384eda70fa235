-- -1 for a malformed tool call (a negative example, never dropped); for a well-formed call, the tool's
-- result decides: +1 when it ran fine, -0.5 when it failed, 0 when unknown. No call: 0.
SELECT rn,
    CASE
        WHEN broken_tool_call THEN -1.0
        WHEN has_tool_calls AND tool_result_fail > 0 THEN -0.5
        WHEN has_tool_calls AND tool_result_ok > 0 THEN 1.0
        ELSE 0.0
    END AS value
FROM scored
