-- One org's feedback, and only the columns the A/B reads (rl_core/ab/org.py materialises this as the table
-- `feedback`). Input: view `lake_feedback` over the window's raw partitions (grace included); parameter $org.
-- Feedback carries its org (the gateway's token), so another org's rows stay out even if they named one of this
-- org's events.
SELECT feedback_id, event_id, org_id, ts, kind, value_bool, value_float, text
FROM lake_feedback
WHERE org_id = $org
