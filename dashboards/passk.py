"""The unbiased pass@k estimator (Chen et al., 2021), computed exactly with integers."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from functools import cache
from math import comb, fsum

MAX_K = 16
"""The largest k the dashboards show."""
MIN_TASKS = 5
"""The fewest tasks a pass@k is averaged over before it is shown (`min_tasks`, env TRAJLAKE_MIN_TASKS)."""


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
    tasks: Iterable[tuple[int, int]],
    ks: Sequence[int] = tuple(range(1, MAX_K + 1)),
    min_tasks: int = MIN_TASKS,
) -> list[dict]:
    """pass@k averaged over the tasks with at least k samples, per k, with the basis it stands on.

    Returns rows `{"k", "pass_at_k", "n_tasks", "n_tasks_total"}`: `n_tasks` of the
    `n_tasks_total` tasks (those with any sample) have k or more samples and make the mean. Below
    `min_tasks` of them `pass_at_k` is None: a mean over one or two tasks is that task's figure, not
    the run's (one task of six samples gave pass@4 = 1.0 beside a pass@1 of 0.08 over twelve). A k
    no task reaches is left out. Tasks share few distinct (n, c) pairs (a run samples a fixed group
    size), so each pair's pass@k is computed once and the mean is an `fsum` weighted by its tasks.
    """
    if min_tasks < 1:
        raise ValueError(f"min_tasks must be >= 1 (got {min_tasks}); set TRAJLAKE_MIN_TASKS")
    pairs = Counter((int(n), int(c)) for n, c in tasks if n)
    total_tasks = sum(pairs.values())
    rows = []
    for k in ks:
        reached = [(pair, count) for pair, count in pairs.items() if pair[0] >= k]
        n_tasks = sum(count for _, count in reached)
        if n_tasks:
            value = fsum(pass_at_k(n, c, k) * count for (n, c), count in reached) / n_tasks
            shown = value if n_tasks >= min_tasks else None
            rows.append({"k": k, "pass_at_k": shown, "n_tasks": n_tasks, "n_tasks_total": total_tasks})
    return rows


def basis(row: dict, min_tasks: int = MIN_TASKS) -> str:
    """What a pass@k row stands on, in words: `13 tasks`, `4 of 13 tasks`, or why it is hidden."""
    k, n, total = row["k"], row["n_tasks"], row["n_tasks_total"]
    if row["pass_at_k"] is None:
        have = "has" if n == 1 else "have"
        return f"hidden: only {n} of {total} tasks {have} >= {k} scored samples (min_tasks {min_tasks})"
    return f"{n} tasks" if n == total else f"{n} of {total} tasks"


def curve_text(rows: Sequence[dict], min_tasks: int = MIN_TASKS, digits: int = 4) -> str:
    """A pass@k curve in one line: each shown value with its tasks, then which k are hidden and why."""
    parts = [
        f"pass@{r['k']}={r['pass_at_k']:.{digits}f} ({basis(r)})" for r in rows if r["pass_at_k"] is not None
    ]
    hidden = [r for r in rows if r["pass_at_k"] is None]
    if hidden:
        first, last = hidden[0]["k"], hidden[-1]["k"]
        ks = f"pass@{first}" if first == last else f"pass@{first}..{last}"
        parts.append(f"{ks} {basis(hidden[0], min_tasks)}")
    return "  ".join(parts) or "no scored trajectories"


def curve_basis(rows: Sequence[dict], min_tasks: int = MIN_TASKS) -> str:
    """What a pass@k curve stands on, in one sentence: its tasks at k = 1, at the largest k shown,
    and from which k it is hidden and why."""
    shown = [r for r in rows if r["pass_at_k"] is not None]
    hidden = [r for r in rows if r["pass_at_k"] is None]
    parts = ["pass@k averages the tasks with at least k scored samples"]
    if shown:
        parts.append(f"k = 1: {basis(shown[0])}")
    if len(shown) > 1:
        parts.append(f"k = {shown[-1]['k']}: {basis(shown[-1])}")
    if hidden:
        parts.append(f"k ≥ {hidden[0]['k']} {basis(hidden[0], min_tasks)}")
    return "; ".join(parts) + "."
