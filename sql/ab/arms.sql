-- The champion/challenger A/B's interactions, one row per event with its arm (the temp table `arms` that
-- outcomes.sql reads). Input: view `interactions` over the lake's raw partitions; parameters
--   $since, $until         the A/B window on ts_request, [since, until)
--   $champion, $challenger the MLflow versions behind each arm (other versions in the window are ignored)
-- A replayed event (the same event_id twice) counts once.
SELECT event_id, user_id, arm, latency_ms
FROM interactions
WHERE ts_request >= $since AND ts_request < $until
  AND ((arm = 'champion' AND model_version = $champion)
    OR (arm = 'challenger' AND model_version = $challenger))
QUALIFY row_number() OVER (PARTITION BY event_id ORDER BY ts_response) = 1
