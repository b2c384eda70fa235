-- Harvest bookkeeping: interactions in [start, end) (of $org_id when it is set), and how many of them the
-- data-rights view `excluded` (opted-out orgs, forget requests) removes. Stale = window - episodes - excluded.
SELECT
    count(*) AS n_window,
    count(*) FILTER (WHERE EXISTS (
        SELECT 1 FROM excluded x
        WHERE x.org_id = i.org_id AND (x.user_id IS NULL OR x.user_id = i.user_id)
    )) AS n_excluded
FROM interactions i
WHERE ts_request >= $start AND ts_request < $end
  AND ($org_id IS NULL OR i.org_id = $org_id)
