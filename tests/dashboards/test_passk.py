import itertools
from fractions import Fraction
from math import comb

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trajlake.dashboards.passk import basis, curve_basis, curve_text, mean_pass_at_k, pass_at_k


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (10, 0, 1, 0.0),
        (10, 10, 1, 1.0),
        (10, 3, 1, 0.3),
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (16, 1, 16, 1.0),
        (8, 5, 4, 1.0),  # n - c = 3 < k: every draw holds a success
        (5, 2, 3, 0.9),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
    ],
    ids=["none", "all", "p1", "half", "k_eq_n", "n_minus_c_lt_k", "tenths"],
)
def test_pass_at_k_known_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == expected


@given(st.integers(1, 300), st.data())
def test_pass_at_k_is_the_exact_fraction_rounded_once(n, data):
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    exact = 1 - Fraction(comb(n - c, k), comb(n, k))
    assert pass_at_k(n, c, k) == float(exact)


def test_pass_at_k_stays_exact_where_the_naive_float_formula_loses_digits():
    # C(1000, 500) overflows a float; the integer form still gives the right answer.
    assert pass_at_k(1000, 1, 500) == 0.5


@pytest.mark.parametrize(
    ("n", "c", "k"), [(0, 0, 1), (4, 5, 1), (4, 1, 0), (4, 1, 5)], ids=["n0", "c_gt_n", "k0", "k_gt_n"]
)
def test_pass_at_k_rejects_impossible_inputs_with_the_rule(n, c, k):
    with pytest.raises(ValueError, match=r"need n >= 1|k must be between"):
        pass_at_k(n, c, k)


def test_mean_pass_at_k_averages_over_tasks_that_have_k_samples():
    rows = mean_pass_at_k([(4, 1), (2, 0)], ks=[1, 2, 3], min_tasks=1)
    assert rows == [
        {"k": 1, "pass_at_k": (0.25 + 0.0) / 2, "n_tasks": 2, "n_tasks_total": 2},
        {"k": 2, "pass_at_k": (0.5 + 0.0) / 2, "n_tasks": 2, "n_tasks_total": 2},
        {"k": 3, "pass_at_k": 0.75, "n_tasks": 1, "n_tasks_total": 2},
    ]


ISSUE_VERSION_0 = [(1, 0)] * 11 + [(6, 6)]
"""Eleven tasks with one failing sample and one task of six passing ones: pass@1 = 1/12 = 0.083,
and the only task that reaches k = 4 passes every draw."""


def test_a_k_that_one_large_group_reaches_is_hidden_beside_its_coverage():
    rows = {r["k"]: r for r in mean_pass_at_k(ISSUE_VERSION_0, ks=range(1, 7))}
    assert rows[1] == {"k": 1, "pass_at_k": 1 / 12, "n_tasks": 12, "n_tasks_total": 12}
    assert [rows[k]["pass_at_k"] for k in range(2, 7)] == [None] * 5  # not the 1.0 of the one task
    assert [rows[k]["n_tasks"] for k in range(2, 7)] == [1] * 5
    assert basis(rows[4]) == "hidden: only 1 of 12 tasks has >= 4 scored samples (min_tasks 5)"
    assert basis(rows[1]) == "12 tasks"


def test_the_curve_says_which_k_are_hidden_and_on_how_many_tasks_each_value_stands():
    rows = mean_pass_at_k([(4, 1)] * 5 + [(2, 0)] * 3, ks=range(1, 6))
    assert curve_text(rows, digits=3) == (
        "pass@1=0.156 (8 tasks)  pass@2=0.312 (8 tasks)  pass@3=0.750 (5 of 8 tasks)  "
        "pass@4=1.000 (5 of 8 tasks)"
    )
    thin = mean_pass_at_k(ISSUE_VERSION_0, ks=range(1, 7))
    assert curve_text(thin, digits=3) == (
        "pass@1=0.083 (12 tasks)  pass@2..6 hidden: only 1 of 12 tasks has >= 2 scored samples (min_tasks 5)"
    )
    assert curve_basis(thin) == (
        "pass@k averages the tasks with at least k scored samples; k = 1: 12 tasks; "
        "k ≥ 2 hidden: only 1 of 12 tasks has >= 2 scored samples (min_tasks 5)."
    )
    assert curve_text([]) == "no scored trajectories"


@given(
    st.lists(st.tuples(st.integers(1, 12), st.integers(0, 12)), min_size=1, max_size=40), st.integers(1, 10)
)
def test_a_value_is_shown_exactly_when_enough_tasks_reach_its_k(tasks, min_tasks):
    tasks = [(n, min(c, n)) for n, c in tasks]
    for row in mean_pass_at_k(tasks, min_tasks=min_tasks):
        assert row["n_tasks_total"] == len(tasks)
        assert row["n_tasks"] == sum(n >= row["k"] for n, _ in tasks) > 0
        assert (row["pass_at_k"] is None) == (row["n_tasks"] < min_tasks)


def test_min_tasks_below_one_is_refused_with_its_setting():
    with pytest.raises(ValueError, match=r"min_tasks must be >= 1.*TRAJLAKE_MIN_TASKS"):
        mean_pass_at_k([(4, 1)], min_tasks=0)


@given(st.lists(st.tuples(st.integers(16, 40), st.integers(0, 40)), min_size=1, max_size=20))
def test_mean_pass_at_k_rises_with_k_over_a_fixed_set_of_tasks(tasks):
    tasks = [(n, min(c, n)) for n, c in tasks]
    values = [r["pass_at_k"] for r in mean_pass_at_k(tasks, min_tasks=1)]
    assert all(a <= b + 1e-12 for a, b in itertools.pairwise(values))


@given(st.lists(st.tuples(st.integers(1, 20), st.integers(0, 20)), min_size=1, max_size=60))
def test_mean_pass_at_k_is_the_exact_mean_of_every_tasks_pass_at_k(tasks):
    tasks = [(n, min(c, n)) for n, c in tasks]
    for row in mean_pass_at_k(tasks, min_tasks=1):
        reached = [(n, c) for n, c in tasks if n >= row["k"]]
        exact = sum(Fraction(pass_at_k(n, c, row["k"])) for n, c in reached) / len(reached)
        assert row["n_tasks"] == len(reached)
        assert row["pass_at_k"] == pytest.approx(float(exact), rel=1e-15)
