-- What the Python scorers need from episodes.parquet ($path), keyed by the row's position in the file
-- (rn), so a duplicated event_id can never cross-join scores: the gates report duplicates instead.
SELECT
    file_row_number AS rn,
    completion_text,
    tool_calls,
    -- the tools' schemas are only needed (and only parsed) where the turn made a call
    CASE WHEN (tool_calls IS NOT NULL OR contains(completion_text, '<tool_call>')) AND json_valid(messages)
         THEN json_extract(messages, '$.tools')::VARCHAR END AS tools_json,
    followup_text
FROM read_parquet($path, file_row_number = true)
