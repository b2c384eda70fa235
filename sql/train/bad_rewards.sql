-- The first unusable row of runs/<run_id>/rewards.parquet in file order, if any (rl_core/train/data.py raises
-- DataError naming its event): an event_id that an earlier row already has (`repeated`), or a reward that is
-- NULL, NaN or infinite. Every row counts, also rewards of events that episodes.parquet does not hold: a bad
-- rewards file is a bad rewards file. View `rewards` carries `file_row_number` (its place in the file).
-- The filter is a QUALIFY over the window's result, so DuckDB cannot push it into the Parquet scan, where
-- row-group statistics without NaN would skip NaN rows (rl_core/duck.py).
SELECT
    event_id,
    reward,
    row_number() OVER (PARTITION BY event_id ORDER BY file_row_number) > 1 AS repeated
FROM rewards
QUALIFY repeated OR reward IS NULL OR isnan(reward) OR isinf(reward)
ORDER BY file_row_number
LIMIT 1
