-- One arm's latencies with their user cluster (hashed to an integer key: fast to group in numpy),
-- for the cluster bootstrap of the p50/p90 differences. Parameter: $arm.
SELECT hash(user_id) AS user_key, latency_ms
FROM outcomes
WHERE arm = $arm AND latency_ms IS NOT NULL AND isfinite(latency_ms)
