-- Latency in units of the budget, capped at 3 budgets; unknown (NULL) latency costs nothing, while a NaN
-- latency stays NaN so that the rewards gate refuses it instead of hiding a logging defect.
SELECT rn,
    CASE
        WHEN latency_ms IS NULL THEN 0.0
        WHEN isnan(latency_ms) THEN latency_ms
        ELSE least(greatest(latency_ms, 0.0) / $latency_budget_ms, 3.0)
    END AS value
FROM scored
