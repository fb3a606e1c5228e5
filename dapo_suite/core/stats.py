"""Statistics shared by every stage: accuracy over graded samples with its standard error and interval, and
the tests that compare training runs paired by seed. Pure functions, each with its formula.

Notation: P problems; problem i has n_i samples, c_i of them correct; a_i = c_i / n_i its accuracy.
Problems are the sampled unit for uncertainty (a benchmark is a sample of problems; the samples of one
problem are correlated), as in the paired bootstrap of `eval.compare`. Across training runs the unit is the
seed: a few runs per setting, compared pair by pair (the same seed) with a paired t-test and an exact
sign-flip test (`dapo-suite train ladder`).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence

Z_95 = 1.959963984540054  # two-sided 95 % normal quantile


def problem_accuracy(correct: Sequence[bool]) -> float:
    """a_i = c_i / n_i: the fraction of one problem's samples that are correct."""
    return sum(correct) / len(correct)


def avg_at_k(correct: Sequence[Sequence[bool]]) -> float:
    """avg@k = (1/P) sum_i a_i: mean accuracy per problem, averaged over problems (DAPO's avg@32; with equal
    n_i it is the mean correctness of all P*k samples)."""
    return sum(problem_accuracy(c) for c in correct) / len(correct)


def avg_at_k_standard_error(correct: Sequence[Sequence[bool]]) -> float:
    """SE(avg@k) = s / sqrt(P), s = sqrt( sum_i (a_i - avg)^2 / (P - 1) ): the standard error of the mean over
    problems. NaN when P < 2."""
    if len(correct) < 2:
        return math.nan
    return statistics.stdev(problem_accuracy(c) for c in correct) / math.sqrt(len(correct))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem (Chen et al. 2021): 1 - C(n-c, k) / C(n, k), computed as
    1 - prod_{j=n-c+1}^{n} (1 - k/j) to stay exact for large n; 1 when n - c < k."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n = {n}.")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / j for j in range(n - c + 1, n + 1))


def mean_pass_at_k(correct: Sequence[Sequence[bool]], k: int) -> float:
    """pass@k of the benchmark: (1/P) sum_i pass@k(n_i, c_i, k)."""
    return sum(pass_at_k(len(c), sum(c), k) for c in correct) / len(correct)


def confidence_interval_95(mean: float, standard_error: float) -> tuple[float, float]:
    """mean -+ 1.96 SE (normal approximation), clipped to [0, 1]."""
    if math.isnan(standard_error):
        return (math.nan, math.nan)
    return (max(0.0, mean - Z_95 * standard_error), min(1.0, mean + Z_95 * standard_error))


# ---- Across seeds: a few runs per setting, paired by seed ------------------------------------------------


def mean_and_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation s = sqrt( sum (x - mean)^2 / (N - 1) ) of N runs; s is NaN for N <
    2."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else math.nan


def student_t_two_sided_p(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t with an integer df >= 1, in closed form (Abramowitz & Stegun 26.7.3-4):
    with theta = atan(|t| / sqrt(df)), A = P(|T| < |t|) is
      df odd:  (2/pi) (theta + sin(theta) (cos(theta) + 2/3 cos^3(theta) + ... + [2*4..(df-3)]/[1*3..(df-2)]
      cos^(df-2))) df even: sin(theta) (1 + 1/2 cos^2(theta) + ... + [1*3..(df-3)]/[2*4..(df-2)]
      cos^(df-2)(theta))
    (the odd sum is empty for df = 1), and p = 1 - A. Exact for the integer df of a paired t-test."""
    if df < 1:
        raise ValueError(f"Student's t needs df >= 1, got {df}")
    if math.isinf(t):
        return 0.0
    theta = math.atan(abs(t) / math.sqrt(df))
    cos2 = math.cos(theta) ** 2
    # Both series have terms T_k = T_(k-2) cos^2 (k-1)/k, from T_1 = cos (odd) or T_0 = 1 (even), up to k =
    # df-2.
    first = 1 if df % 2 else 0
    term = math.cos(theta) if first else 1.0
    total = term if df > 1 else 0.0
    for k in range(first + 2, df - 1, 2):
        term *= cos2 * (k - 1) / k
        total += term
    inside = (2 / math.pi) * (theta + math.sin(theta) * total) if first else math.sin(theta) * total
    return min(1.0, max(0.0, 1.0 - inside))


def student_t_quantile(level: float, df: int) -> float:
    """The t with P(|T_df| < t) = level (e.g. level 0.95 -> 12.706 for df = 1, 4.303 for df = 2), by bisection
    on `student_t_two_sided_p`."""
    low, high = 0.0, 1.0
    while student_t_two_sided_p(high, df) > 1 - level:
        high *= 2
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if student_t_two_sided_p(middle, df) > 1 - level else (low, middle)
    return (low + high) / 2


def paired_t_test(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """Paired t-test of B against A over N pairs (here: seeds). d_i = b_i - a_i, mean d, s_d their sample std,
    t = mean d / (s_d / sqrt(N)) with N - 1 degrees of freedom; two-sided p; 95 % interval
    mean d -+ t_(0.975, N-1) s_d / sqrt(N). It assumes normal differences, which N = 3 cannot check.
    Equal differences (s_d = 0): p = 1 when all are 0, else 0 (t is infinite). N < 2: NaN throughout."""
    diffs = paired_differences(a, b)
    n = len(diffs)
    delta = statistics.fmean(diffs)
    if n < 2:
        return {
            "n": n,
            "delta": delta,
            "t": math.nan,
            "df": 0,
            "p_value": math.nan,
            "ci95": [math.nan, math.nan],
        }
    sd = statistics.stdev(diffs)
    if sd == 0:
        t = 0.0 if delta == 0 else math.copysign(math.inf, delta)
    else:
        t = delta / (sd / math.sqrt(n))
    half = student_t_quantile(0.95, n - 1) * sd / math.sqrt(n)
    return {
        "n": n,
        "delta": delta,
        "t": t,
        "df": n - 1,
        "p_value": 1.0 if delta == 0 and sd == 0 else student_t_two_sided_p(t, n - 1),
        "ci95": [delta - half, delta + half],
    }


def sign_flip_test(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """Exact paired permutation (sign-flip) test of B against A over N pairs: under H0 (no difference) each
    d_i = b_i - a_i is as likely to have the other sign, so the 2^N sign patterns are equally likely; the
    two-sided p is the share of patterns with |mean(s_i d_i)| >= |mean d_i| (Fisher 1935). No normality is
    assumed, and the smallest p it can give is 2 / 2^N (0.25 for N = 3, 0.0625 for N = 5, below 0.05 from N =
    6). Enumerates every pattern, so N <= 20."""
    diffs = paired_differences(a, b)
    n = len(diffs)
    if n > 20:
        raise ValueError(f"the exact sign-flip test enumerates 2^N sign patterns; N = {n} is more than 20")
    observed = abs(sum(diffs))
    tolerance = 1e-9 * max([1.0, *map(abs, diffs)])  # equal sums must count as equal despite rounding
    extreme = sum(
        abs(sum(s * d for s, d in zip(signs, diffs, strict=True))) >= observed - tolerance
        for signs in itertools.product((1, -1), repeat=n)
    )
    return {
        "n": n,
        "delta": statistics.fmean(diffs) if diffs else math.nan,
        "p_value": extreme / 2**n,
        "min_p_value": min(1.0, 2 / 2**n),
    }


def paired_differences(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """d_i = b_i - a_i over pairs given in the same order (the same seed, the same problem)."""
    if len(a) != len(b):
        raise ValueError(f"paired samples need the same length, got {len(a)} and {len(b)}")
    return [y - x for x, y in zip(a, b, strict=True)]
