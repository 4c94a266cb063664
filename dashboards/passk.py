"""The unbiased pass@k estimator (Chen et al., 2021), computed exactly with integers."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from functools import cache
from math import comb, fsum

MAX_K = 16
"""The largest k the dashboards show."""


@cache
def pass_at_k(n: int, c: int, k: int) -> float:
    """1 − C(n−c, k) / C(n, k): the chance that k of n samples (c of them correct) hold a success.

    Computed as one exact fraction and rounded once, so it is exact to the last bit of the float
    (Python's int / int is correctly rounded however large the integers; `Fraction` gave the same
    floats, 6x slower). Memoised: runs and policy versions share most (n, c) pairs.
    """
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"need n >= 1 and 0 <= c <= n (got n={n}, c={c})")
    if not 1 <= k <= n:
        raise ValueError(f"k must be between 1 and n={n} (got k={k}); a task with n samples supports k <= n")
    if n - c < k:
        return 1.0  # every draw of k samples contains a success
    total = comb(n, k)
    return (total - comb(n - c, k)) / total


def mean_pass_at_k(
    tasks: Iterable[tuple[int, int]], ks: Sequence[int] = tuple(range(1, MAX_K + 1))
) -> list[dict]:
    """pass@k averaged over tasks, per k, from (n samples, c successes) per task.

    A task contributes to k only when it has at least k samples; a k no task reaches is left out.
    Tasks share few distinct (n, c) pairs (a run samples a fixed group size), so each pair's
    pass@k is computed once, not once per task, and the mean is an `fsum` weighted by how many
    tasks share the pair. Returns rows `{"k", "pass_at_k", "n_tasks"}`.
    """
    pairs = Counter((int(n), int(c)) for n, c in tasks if n)
    rows = []
    for k in ks:
        reached = [(pair, count) for pair, count in pairs.items() if pair[0] >= k]
        n_tasks = sum(count for _, count in reached)
        if n_tasks:
            total = fsum(pass_at_k(n, c, k) * count for (n, c), count in reached)
            rows.append({"k": k, "pass_at_k": total / n_tasks, "n_tasks": n_tasks})
    return rows
