"""The one Mann-Whitney entry point against scipy, and its three treatments of ties."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import PermutationMethod, mannwhitneyu

from service.errors import InvalidInput
from service.mann_whitney import (
    MWU_MAX,
    Ties,
    exact_tail_rows,
    mann_whitney_p,
    mann_whitney_rows,
)
from service.runs.compare import smallest_p_value

ALTERNATIVES = ("two-sided", "greater", "less")


def _u(x, y) -> float:
    """U of ``x``: pairs where x is larger, ties one half."""
    return sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in x for b in y)


def _enumerated_p(x, y, alternative: str) -> float:
    """The exact permutation p-value by listing every split of the pooled values (two-sided:
    twice the smaller tail, as scipy)."""
    pooled, n = list(x) + list(y), len(x)
    observed = _u(x, y)
    us = []
    for idx in itertools.combinations(range(len(pooled)), n):
        rest = [v for i, v in enumerate(pooled) if i not in idx]
        us.append(_u([pooled[i] for i in idx], rest))
    us_arr = np.array(us)
    if alternative == "greater":
        return float(np.mean(us_arr >= observed))
    if alternative == "less":
        return float(np.mean(us_arr <= observed))
    tails = np.mean(us_arr >= observed), np.mean(us_arr <= observed)
    return float(min(1.0, 2 * min(tails)))


@pytest.mark.parametrize("alternative", ALTERNATIVES)
@pytest.mark.parametrize("n,m", [(1, 5), (3, 4), (6, 8), (9, 12), (25, 30), (40, 7)])
def test_without_ties_it_is_scipy_s_test(alternative, n, m):
    rng = np.random.default_rng(n * 100 + m)
    x, y = rng.normal(0.4, 1, n), rng.normal(0, 1, m)
    ref = mannwhitneyu(x, y, alternative=alternative).pvalue
    assert mann_whitney_p(x, y, alternative=alternative) == ref
    assert mann_whitney_p(x, y, alternative=alternative, ties=Ties.NORMAL) == ref
    if n <= 8 or m <= 8:
        exact = mannwhitneyu(x, y, alternative=alternative, method="exact").pvalue
        assert mann_whitney_p(x, y, alternative=alternative) == pytest.approx(exact, rel=1e-12)


@pytest.mark.parametrize("alternative", ALTERNATIVES)
@pytest.mark.parametrize(
    "x,y",
    [
        ([1.0, 1.0, 2.0, 2.0], [2.0, 2.0, 3.0, 3.0]),
        ([100.0, 100.0, 100.0, 101.0], [102.0, 102.0, 103.0, 103.0]),
        ([5.0, 5.0, 5.0], [5.0, 6.0, 6.0, 4.0, 6.0]),
        ([0.0, 1.0, 1.0, 2.0, 2.0, 3.0], [1.0, 2.0, 2.0, 3.0, 4.0, 4.0]),
    ],
)
def test_small_tied_samples_get_the_exact_permutation_p_value(alternative, x, y):
    ours = mann_whitney_p(x, y, alternative=alternative)
    assert ours == pytest.approx(_enumerated_p(x, y, alternative), rel=1e-12)
    method = PermutationMethod(n_resamples=10**6)
    assert ours == pytest.approx(
        mannwhitneyu(x, y, alternative=alternative, method=method).pvalue, rel=1e-12
    )


def test_ties_never_go_below_the_floor_the_sides_allow():
    # Peak memory repeats to the byte: scipy's normal approximation gave 0.0247 here, below
    # the 0.0286 that 4 vs 4 processes can ever give.
    a, b = [100.0, 100.0, 100.0, 101.0], [102.0, 102.0, 103.0, 103.0]
    assert mannwhitneyu(b, a, alternative="two-sided").pvalue < smallest_p_value(4, 4)
    assert mann_whitney_p(b, a) == pytest.approx(smallest_p_value(4, 4))
    assert mann_whitney_p(b, a, ties=Ties.NORMAL) == pytest.approx(0.0247, abs=1e-4)
    # Heavier ties: every split of the pooled values counted (70 of them), 12 as extreme.
    assert mann_whitney_p([2.0, 2.0, 3.0, 3.0], [1.0, 1.0, 2.0, 2.0]) == pytest.approx(12 / 70)


def test_large_tied_samples_and_normal_ties_use_the_tie_corrected_approximation():
    rng = np.random.default_rng(3)
    x, y = rng.integers(0, 4, 8).astype(float), rng.integers(1, 5, 8).astype(float)
    ref = mannwhitneyu(x, y, alternative="two-sided", method="asymptotic").pvalue
    assert mann_whitney_p(x, y) == ref  # C(16, 8) = 12,870 splits: too many to list
    small_x, small_y = x[:4], y[:4]
    assert mann_whitney_p(small_x, small_y, ties=Ties.NORMAL) == (
        mannwhitneyu(small_x, small_y, alternative="two-sided", method="asymptotic").pvalue
    )


@pytest.mark.parametrize("m,k", [(1, 7), (2, 13), (3, 28), (5, 9), (28, 28), (MWU_MAX, 1)])
def test_half_without_ties_is_scipy_s_exact_one_sided_test(m, k):
    rng = np.random.default_rng(m * 100 + k)
    post, base = rng.normal(0.5, 1, m), rng.normal(0, 1, k)
    for alternative in ("greater", "less"):
        ours = mann_whitney_p(post, base, alternative=alternative, ties=Ties.HALF)
        ref = mannwhitneyu(post, base, alternative=alternative, method="exact").pvalue
        assert ours == pytest.approx(ref, rel=1e-9)


def test_half_reads_the_untied_tail_at_floor_u():
    post, base = [1.0, 1.0], [1.0, 1.0, 0.0, 0.0, 0.0]
    # U = 2 * 3 + 0.5 * 4 = 8: the tail P(U >= 8) of 2 vs 5 distinct values (ranks 0..6, U of
    # a pair of ranks is their sum - 1): 4 of the 21 pairs.
    ours = mann_whitney_p(post, base, alternative="greater", ties=Ties.HALF)
    assert ours == pytest.approx(4 / 21)
    # U = 0.5 * 3 = 1.5 for 1 vs 3 ties, read at U = 1: P(U >= 1) of 1 vs 3 is 3/4.
    half = mann_whitney_p([2.0], [2.0, 2.0, 2.0], alternative="greater", ties=Ties.HALF)
    assert half == pytest.approx(3 / 4)


def test_exact_tail_rows_are_the_scalar_test_row_by_row():
    rng = np.random.default_rng(7)
    post = np.full((40, 6), np.nan)
    base = np.full((40, MWU_MAX), np.nan)
    greater = rng.random(40) < 0.5
    expected = []
    for r in range(40):
        m, k = int(rng.integers(1, 7)), int(rng.integers(1, MWU_MAX + 1))
        p, b = np.round(rng.normal(0.3, 1, m), 1), np.round(rng.normal(0, 1, k), 1)
        post[r, :m], base[r, :k] = p, b
        alt = "greater" if greater[r] else "less"
        expected.append(mann_whitney_p(p, b, alternative=alt, ties=Ties.HALF))
    assert exact_tail_rows(post, base, greater).tolist() == expected


def test_rows_are_scipy_s_test_along_the_last_axis():
    rng = np.random.default_rng(11)
    x, y = rng.normal(0.2, 1, (50, 12)), rng.normal(0, 1, 15)
    rows = mann_whitney_rows(x, np.broadcast_to(y, (50, 15)))
    assert rows.shape == (50,)
    assert rows.tolist() == [mann_whitney_p(row, y, ties=Ties.NORMAL) for row in x]


def test_bad_sides_are_refused():
    with pytest.raises(InvalidInput, match="at least one value"):
        mann_whitney_p([], [1.0])
    with pytest.raises(InvalidInput, match="exact one-sided table"):
        mann_whitney_p([1.0], [2.0], ties=Ties.HALF)
    with pytest.raises(InvalidInput, match="exact one-sided table"):
        mann_whitney_p([1.0] * (MWU_MAX + 1), [2.0], alternative="greater", ties=Ties.HALF)
    with pytest.raises(ValueError, match="bogus"):
        mann_whitney_p([1.0], [2.0], ties="bogus")  # type: ignore[arg-type]
