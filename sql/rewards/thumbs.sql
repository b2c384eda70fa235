-- +1 thumbs up, -1 thumbs down (their sign when both), credited like the other delayed outcomes.
SELECT rn, sign(thumbs_up - thumbs_down)::DOUBLE * credit_weight AS value
FROM scored
