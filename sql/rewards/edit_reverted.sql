-- 1 when the user reverted the applied edit (the weight is negative).
SELECT rn, CASE WHEN edit_reverted THEN 1.0 ELSE 0.0 END * credit_weight AS value
FROM scored
