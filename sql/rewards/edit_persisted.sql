-- +1 when the user's edit from this turn was still in place when observed (delayed outcome, credited).
SELECT rn, CASE WHEN edit_persisted THEN 1.0 ELSE 0.0 END * credit_weight AS value
FROM scored
