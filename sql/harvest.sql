-- One cycle's episodes: interactions in [start, end) served by a version within max_staleness of the
-- policy being updated, joined with every feedback event that arrived before end + grace.
-- Views `interactions` and `feedback` are the window's Parquet files (rl_core/harvest.py binds them;
-- `interactions` carries DuckDB's `filename` and `file_row_number`); view `lake_files` (filename, file_no)
-- numbers the window's interaction files in lake order (sorted by name).
-- Narrow on purpose: this returns each episode's place in the lake (file_no, row) and what the join adds
-- (version lag, feedback, credit), in lake order. rl_core/harvest.py then streams the wide columns (token
-- ids, logprobs, messages) file by file straight from Parquet beside it: sorting a million wide rows
-- cost more than the whole rest of the harvest. Lake order is deterministic (sorted files, rows sorted by
-- ts within each), so reruns still give byte-identical output.
-- Interactions are NOT deduplicated here: a repeated event_id is a collector defect the gates must see.
-- Feedback is deduplicated by its idempotency key (feedback_id) and must come from the interaction's org.
-- granularity 'turn': each turn keeps its own feedback, credit_weight = 1.
-- granularity 'session': each turn carries its session's outcome (feedback summed over the session's
-- turns in the window), credited with discount ^ (turns before the session's last turn).
-- Data rights: view `excluded` (org_id, user_id) holds the opted-out orgs and the forget registry's requests
-- (user_id NULL = the whole org); their rows never become episodes. $org_id (NULL = every org) narrows the
-- harvest to one organisation, for its adapter.
-- Ledger: view `consumed` (event_id, run_id, ...) holds the episodes the policy's lineage already trained on
-- (rl_core/ledger.py); they never become episodes again, except in the run that consumed them ($run_id: a
-- rerun of that run harvests the same episodes). Empty when the caller passes no lineage.
-- A file's number, not its name, travels through the join and the sort: at 10M interactions the names alone
-- (~100 bytes a row) took ~1 GB of DuckDB's memory limit (docs/benchmarks.md).
WITH win AS (
    SELECT i.*, lf.file_no
    FROM interactions i
    JOIN lake_files lf ON lf.filename = i.filename
    WHERE ts_request >= $start AND ts_request < $end
      AND $policy_version - model_version BETWEEN 0 AND $max_staleness
      AND ($org_id IS NULL OR i.org_id = $org_id)
      AND NOT EXISTS (
          SELECT 1 FROM excluded x
          WHERE x.org_id = i.org_id AND (x.user_id IS NULL OR x.user_id = i.user_id)
      )
      AND NOT EXISTS (SELECT 1 FROM consumed c WHERE c.event_id = i.event_id AND c.run_id <> $run_id)
),
fb AS (
    SELECT f.*
    FROM feedback f
    SEMI JOIN win w ON f.event_id = w.event_id AND f.org_id = w.org_id
    WHERE f.ts < $grace_end
    QUALIFY row_number() OVER (PARTITION BY f.feedback_id ORDER BY f.ts, f.kind, f.event_id) = 1
),
agg AS (
    SELECT
        event_id,
        count(*)::INTEGER AS n_feedback,
        bool_or(kind = 'edit_applied') AS edit_applied,
        bool_or(kind = 'edit_persisted') AS edit_persisted,
        max(value_float) FILTER (WHERE kind = 'edit_persisted') AS edit_persisted_hours,
        bool_or(kind = 'edit_reverted') AS edit_reverted,
        string_agg(text, chr(10) ORDER BY ts, feedback_id) FILTER (WHERE kind = 'followup_message') AS followup_text,
        (count(*) FILTER (WHERE kind = 'tool_result' AND value_bool))::INTEGER AS tool_result_ok,
        (count(*) FILTER (WHERE kind = 'tool_result' AND NOT value_bool))::INTEGER AS tool_result_fail,
        (count(*) FILTER (WHERE kind = 'thumbs' AND value_bool))::INTEGER AS thumbs_up,
        (count(*) FILTER (WHERE kind = 'thumbs' AND NOT value_bool))::INTEGER AS thumbs_down,
        bool_or(kind = 'session_end') AS session_end
    FROM fb
    GROUP BY event_id
),
turns AS (
    SELECT
        w.*,
        coalesce(a.n_feedback, 0) AS t_n_feedback,
        coalesce(a.edit_applied, false) AS t_edit_applied,
        coalesce(a.edit_persisted, false) AS t_edit_persisted,
        a.edit_persisted_hours AS t_edit_persisted_hours,
        coalesce(a.edit_reverted, false) AS t_edit_reverted,
        a.followup_text AS t_followup_text,
        coalesce(a.tool_result_ok, 0) AS t_tool_result_ok,
        coalesce(a.tool_result_fail, 0) AS t_tool_result_fail,
        coalesce(a.thumbs_up, 0) AS t_thumbs_up,
        coalesce(a.thumbs_down, 0) AS t_thumbs_down,
        coalesce(a.session_end, false) AS t_session_end
    FROM win w
    LEFT JOIN agg a USING (event_id)
),
sessions AS (
    SELECT
        *,
        sum(t_n_feedback) OVER s AS s_n_feedback,
        bool_or(t_edit_applied) OVER s AS s_edit_applied,
        bool_or(t_edit_persisted) OVER s AS s_edit_persisted,
        max(t_edit_persisted_hours) OVER s AS s_edit_persisted_hours,
        bool_or(t_edit_reverted) OVER s AS s_edit_reverted,
        string_agg(t_followup_text, chr(10) ORDER BY turn_index, event_id) OVER s AS s_followup_text,
        sum(t_tool_result_ok) OVER s AS s_tool_result_ok,
        sum(t_tool_result_fail) OVER s AS s_tool_result_fail,
        sum(t_thumbs_up) OVER s AS s_thumbs_up,
        sum(t_thumbs_down) OVER s AS s_thumbs_down,
        bool_or(t_session_end) OVER s AS s_session_end,
        max(turn_index) OVER s AS s_last_turn
    FROM turns
    WHERE $granularity = 'session'
    WINDOW s AS (PARTITION BY org_id, session_id)
)
SELECT
    file_no, file_row_number,
    ($policy_version - model_version)::INTEGER AS version_lag,
    t_n_feedback AS n_feedback, t_edit_applied AS edit_applied, t_edit_persisted AS edit_persisted,
    t_edit_persisted_hours AS edit_persisted_hours, t_edit_reverted AS edit_reverted,
    t_followup_text AS followup_text, t_tool_result_ok AS tool_result_ok,
    t_tool_result_fail AS tool_result_fail, t_thumbs_up AS thumbs_up, t_thumbs_down AS thumbs_down,
    t_session_end AS session_end, 1.0::DOUBLE AS credit_weight
FROM turns
WHERE $granularity = 'turn'
UNION ALL
SELECT
    file_no, file_row_number,
    ($policy_version - model_version)::INTEGER AS version_lag,
    s_n_feedback::INTEGER, s_edit_applied, s_edit_persisted, s_edit_persisted_hours, s_edit_reverted,
    s_followup_text, s_tool_result_ok::INTEGER, s_tool_result_fail::INTEGER, s_thumbs_up::INTEGER,
    s_thumbs_down::INTEGER, s_session_end,
    pow($discount, s_last_turn - turn_index)::DOUBLE AS credit_weight
FROM sessions
ORDER BY file_no, file_row_number
