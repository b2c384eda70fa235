-- Per (arm, user) sums: the clusters of the A/B analysis. Standard errors are clustered by user
-- because one user's interactions are correlated (same habits, same repo), so they are not
-- independent draws; the delta method over these sums gives the ratio estimators' variance.
SELECT
    arm,
    user_id,
    count(*)::DOUBLE AS n,
    sum(persisted)::DOUBLE AS persisted,
    sum(dissatisfied)::DOUBLE AS dissatisfied,
    sum(reward)::DOUBLE AS reward
FROM outcomes
GROUP BY arm, user_id
ORDER BY arm, user_id
