-- 1 when the user's next message reads dissatisfied (rl_core/rewards/followup.py; weight negative).
SELECT rn, CASE WHEN dissatisfied THEN 1.0 ELSE 0.0 END * credit_weight AS value
FROM scored
