-- One org's adapter A/B (rl_core/ab/org.py): the org's interactions answered by its adapter's base version,
-- one row per event with its arm, for the temp table `arms` that outcomes.sql reads:
--   'champion'   answered by the base version without an adapter (adapter_version IS NULL)
--   'challenger' answered by the adapter under judgement (adapter_version = $adapter)
-- Input: table `interactions`, which holds only the org's rows (org_interactions.sql); parameters
--   $since, $until  the A/B window on ts_request, [since, until)
--   $org            the org (a second wall: the table already holds nothing else)
--   $base           the version the adapter was trained on and is served on
--   $adapter        the adapter's serving name (interactions.adapter_version)
-- Left out: pinned requests (`rtrl-policy/<n>`: never answered by an adapter, so not a control), other versions
-- and other adapters of the org (an older live one in the same window). A replayed event counts once.
SELECT event_id, user_id, CASE WHEN adapter_version IS NULL THEN 'champion' ELSE 'challenger' END AS arm, latency_ms
FROM interactions
WHERE ts_request >= $since AND ts_request < $until
  AND org_id = $org
  AND model_version = $base
  AND arm <> 'pinned'
  AND (adapter_version IS NULL OR adapter_version = $adapter)
QUALIFY row_number() OVER (PARTITION BY event_id ORDER BY ts_response) = 1
