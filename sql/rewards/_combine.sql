-- Weighted sum of the signals (weights from rtrl.toml [rewards]), clipped to +-reward_clip. A NaN stays
-- NaN for the gate to refuse. A broken tool call is capped at -|w_tool_call_validity|: always negative.
SELECT
    event_id, edit_persisted, edit_reverted, dissatisfied_followup, latency, tool_call_validity,
    clarification, thumbs, broken_tool_call, is_clarifying,
    CASE
        WHEN isnan(raw) THEN raw
        WHEN broken_tool_call THEN least(greatest(raw, -$reward_clip), $reward_clip, -abs($w_tool_call_validity))
        ELSE least(greatest(raw, -$reward_clip), $reward_clip)
    END AS reward,
    $reward_config_hash AS reward_config_hash
FROM (
    SELECT *,
        $w_edit_persisted * edit_persisted + $w_edit_reverted * edit_reverted
        + $w_dissatisfied_followup * dissatisfied_followup + $w_latency * latency
        + $w_tool_call_validity * tool_call_validity + $w_clarification * clarification
        + $w_thumbs * thumbs AS raw
    FROM signals
)
ORDER BY rn
