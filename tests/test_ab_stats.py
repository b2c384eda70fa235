"""Statistical checks of the A/B intervals on simulated null data (no effect): ~95% of the 95% intervals
must cover 0. Thousands of replications run at once (the stats functions take a leading batch axis)."""

from __future__ import annotations

import numpy as np

from rl_core.ab import stats


def clustered_null(rng, reps, users, mean_n=8.0, base=0.3, user_sd=0.15):
    """Per-user sums (y, n) and a pre-period rate x for both arms, no treatment effect; strong user effects."""
    arms = []
    for _ in range(2):
        n = rng.poisson(mean_n, (reps, users)) + 1
        p_user = np.clip(base + rng.normal(0, user_sd, (reps, users)), 0, 1)
        y = rng.binomial(n, p_user)
        x = rng.binomial(20, p_user) / 20.0  # the same user, before the test
        arms.append((y.astype(float), n.astype(float), x))
    return arms


def test_clustered_interval_covers_zero_about_95_percent_on_null_data():
    rng = np.random.default_rng(0)
    (ya, na, _), (yb, nb, _) = clustered_null(rng, reps=4000, users=300)
    _, _, diff, se, lo, hi = stats.ratio_diff((ya, na), (yb, nb), alpha=0.05)
    coverage = np.mean((lo <= 0) & (0 <= hi))
    assert 0.935 <= coverage <= 0.965, coverage

    # treating interactions as independent ignores the user clusters: too narrow, under-covers
    pa, pb = ya.sum(1) / na.sum(1), yb.sum(1) / nb.sum(1)
    naive_se = np.sqrt(pa * (1 - pa) / na.sum(1) + pb * (1 - pb) / nb.sum(1))
    naive = np.mean(np.abs(diff) <= 1.96 * naive_se)
    assert naive < 0.90, naive
    assert np.all(se > naive_se * 0.99)


def test_cuped_keeps_coverage_and_cuts_variance():
    rng = np.random.default_rng(1)
    (ya, na, xa), (yb, nb, xb) = clustered_null(rng, reps=3000, users=300)
    xa[:, :30] = np.nan  # some users have no pre-period
    _, _, _, se_plain, _, _ = stats.ratio_diff((ya, na), (yb, nb), alpha=0.05)
    _, _, diff, se, lo, hi = stats.ratio_diff((ya, na), (yb, nb), alpha=0.05, x_champ=xa, x_chall=xb)
    coverage = np.mean((lo <= 0) & (0 <= hi))
    assert 0.93 <= coverage <= 0.965, coverage
    assert np.median(se / se_plain) < 0.85  # ~28% less variance with 10% of users lacking a pre-period
    assert abs(np.mean(diff)) < 3 * np.std(diff) / np.sqrt(len(diff))  # unbiased under the null


def test_latency_quantile_bootstrap_covers_zero_about_95_percent():
    rng = np.random.default_rng(2)
    reps, users, covered_p50, covered_p90 = 300, 150, 0, 0
    for r in range(reps):
        arms = []
        for _ in range(2):
            counts = rng.poisson(6, users) + 1
            user = np.repeat(np.arange(users), counts)
            user_effect = rng.normal(0, 0.3, users)[user]
            arms.append((800 * np.exp(user_effect + 0.5 * rng.standard_normal(len(user))), user))
        out = stats.quantile_diffs(arms[0], arms[1], (0.5, 0.9), alpha=0.05, iters=200, seed=r)
        covered_p50 += out[0.5].lo <= 0 <= out[0.5].hi
        covered_p90 += out[0.9].lo <= 0 <= out[0.9].hi
    assert 0.90 <= covered_p50 / reps <= 0.985, covered_p50 / reps
    assert 0.90 <= covered_p90 / reps <= 0.985, covered_p90 / reps


def test_quantile_interval_detects_a_real_shift_and_reports_exact_points():
    rng = np.random.default_rng(3)
    users = np.repeat(np.arange(400), 10)
    a = 800 * np.exp(0.5 * rng.standard_normal(users.size))
    b = 1.2 * 800 * np.exp(0.5 * rng.standard_normal(users.size))
    out = stats.quantile_diffs((a, users), (b, users + 10_000), (0.5, 0.9), alpha=0.05, iters=300)
    assert out[0.9].lo > 0 and out[0.5].lo > 0
    assert out[0.9].champion == np.quantile(a, 0.9) and out[0.9].challenger == np.quantile(b, 0.9)
    assert out[0.5].p_value < 0.001
