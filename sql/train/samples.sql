-- The trainer's input: every episode of runs/<run_id>/episodes.parquet joined with its reward, one row per
-- episode in file order (rl_core/train/data.py binds the views and turns the rows into Samples).
-- Views: `episodes` and `rewards`, each one file with `file_row_number` (its place in the file, so a key for
-- `episodes`), and `optional_columns`, an empty table of the episode columns a file may lack (task,
-- temperature, top_p, credit_weight): UNION BY NAME gives them NULL there, and NULL means what it meant
-- before (no task, temperature 1, top_p 1, credit 1).
-- Run sql/train/bad_rewards.sql first: with a repeated reward event_id this join would repeat episodes.
-- Global narrow columns, sharded wide ones. Every row comes back with what the advantage baselines need
-- (reward, prompt group, org/task, time, credit) and with the lengths and checks of its token lists, because
-- the baselines (prompt-group means, the running per-org/task mean, the normalising std) and DataStats are
-- taken over the whole cycle, identically on every rank. The wide columns (token ids, logprobs) are filled
-- only on the rows of rank $rank of $world, so a rank never materialises another rank's tokens in Python:
-- `mine` = (row number in event_id order) % $world = $rank, balanced (counts differ by at most one) and the
-- same whatever the file order. $world = 1: every row is mine. DuckDB still scans every row's token lists
-- (their lengths, prompt groups and checks are global facts); what a rank skips is turning other ranks'
-- lists into Python objects, the costly part of loading (columns not named here, such as messages, are never
-- read).
-- prompt_group: the first file row with the same prompt token ids (equal lists, not a hash: no collisions).
-- order_us: ts_request in microseconds since the epoch (0 when NULL), the running baseline's time order.
-- Checks are facts, not filters (data.py names the first bad row): has_reward, repeated (an event_id seen
-- earlier in the file), lp_bad (a logprob breaking the one rule: bad_logprobs(), rl_core/schema.py). NaN is only ever
-- tested in SELECT expressions, never in a WHERE clause (rl_core/duck.py: Parquet statistics leave NaN out).
WITH ep AS (
    SELECT * FROM episodes
    UNION ALL BY NAME
    SELECT * FROM optional_columns
),
keyed AS (  -- the windows see only their keys: a window carries every column of its input along
    SELECT
        file_row_number,
        row_number() OVER (PARTITION BY event_id ORDER BY file_row_number) > 1 AS repeated,
        min(file_row_number) OVER (PARTITION BY prompt_token_ids) AS prompt_group,
        (row_number() OVER (ORDER BY event_id, file_row_number) - 1) % $world = $rank AS mine
    FROM episodes
)
SELECT
    e.file_row_number,
    e.event_id,
    e.org_id,
    e.task,
    r.reward,
    r.event_id IS NOT NULL AS has_reward,
    k.repeated,
    k.prompt_group,
    coalesce(epoch_us(e.ts_request), 0) AS order_us,
    coalesce(e.credit_weight, 1.0)::DOUBLE AS credit,
    e.temperature::DOUBLE AS temperature,
    coalesce(e.top_p < 1.0, false) AS top_p_below_one,
    coalesce(len(e.prompt_token_ids), 0) AS prompt_len,
    coalesce(len(e.completion_token_ids), 0) AS completion_len,
    coalesce(len(e.completion_logprobs), 0) AS logprobs_len,
    coalesce(bad_logprobs(e.completion_logprobs) > 0, false) AS lp_bad,
    k.mine,
    CASE WHEN k.mine THEN e.prompt_token_ids END AS prompt_token_ids,
    CASE WHEN k.mine THEN e.completion_token_ids END AS completion_token_ids,
    CASE WHEN k.mine THEN e.completion_logprobs END AS completion_logprobs
FROM ep e
JOIN keyed k USING (file_row_number)
LEFT JOIN rewards r ON r.event_id = e.event_id
ORDER BY e.file_row_number
