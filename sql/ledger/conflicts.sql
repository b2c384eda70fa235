-- Before a run registers its version (rl_core/registry/register.py): which other runs of the same lineage
-- already consumed some of its episodes. View `episodes` is runs/<run_id>/episodes.parquet (event_id), view
-- `consumed` the lineage's ledger (rl_core/ledger.py). Registering the run anyway would train those episodes
-- twice; that happens only when two runs harvested them before either registered (concurrent windows).
-- One row per other run: run_id, how many of this run's episodes it consumed.
SELECT c.run_id, count(DISTINCT e.event_id) AS n
FROM episodes e
JOIN consumed c ON c.event_id = e.event_id
WHERE c.run_id <> $run_id
GROUP BY c.run_id
ORDER BY c.run_id
