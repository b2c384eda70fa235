-- Episodes (only the columns the signals use) joined with the Python scorers' output `scores` by rn.
CREATE TEMP TABLE scored AS
SELECT
    e.file_row_number AS rn, e.event_id, e.org_id, e.session_id, e.turn_index, e.latency_ms,
    e.credit_weight, e.edit_persisted, e.edit_reverted, e.tool_result_ok, e.tool_result_fail,
    e.thumbs_up, e.thumbs_down,
    s.has_tool_calls, s.broken_tool_call, s.is_clarifying, s.dissatisfied
FROM read_parquet($path, file_row_number = true) e
JOIN scores s ON s.rn = e.file_row_number
