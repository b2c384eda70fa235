-- Why a harvest has fewer episodes than its window: per run of the policy's lineage, how many of the window's
-- interactions that sql/harvest.sql would otherwise keep (in [start, end), of $org_id when set, within
-- max_staleness of the policy, not opted out or forgotten) that run already consumed (view `consumed`, the
-- ledger, rl_core/ledger.py). The run being harvested ($run_id) does not count: a rerun keeps its episodes.
-- One row per consuming run: run_id, the version it registered, the interactions it accounts for.
SELECT c.run_id, max(c.version) AS version, count(DISTINCT i.event_id) AS n
FROM interactions i
JOIN consumed c ON c.event_id = i.event_id AND c.run_id <> $run_id
WHERE i.ts_request >= $start AND i.ts_request < $end
  AND $policy_version - i.model_version BETWEEN 0 AND $max_staleness
  AND ($org_id IS NULL OR i.org_id = $org_id)
  AND NOT EXISTS (
      SELECT 1 FROM excluded x
      WHERE x.org_id = i.org_id AND (x.user_id IS NULL OR x.user_id = i.user_id)
  )
GROUP BY c.run_id
ORDER BY c.run_id
