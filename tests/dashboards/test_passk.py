import itertools
from fractions import Fraction
from math import comb

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trajlake.dashboards.passk import mean_pass_at_k, pass_at_k


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
    rows = mean_pass_at_k([(4, 1), (2, 0)], ks=[1, 2, 3])
    assert rows == [
        {"k": 1, "pass_at_k": (0.25 + 0.0) / 2, "n_tasks": 2},
        {"k": 2, "pass_at_k": (0.5 + 0.0) / 2, "n_tasks": 2},
        {"k": 3, "pass_at_k": 0.75, "n_tasks": 1},
    ]


@given(st.lists(st.tuples(st.integers(16, 40), st.integers(0, 40)), min_size=1, max_size=20))
def test_mean_pass_at_k_rises_with_k_over_a_fixed_set_of_tasks(tasks):
    tasks = [(n, min(c, n)) for n, c in tasks]
    values = [r["pass_at_k"] for r in mean_pass_at_k(tasks)]
    assert all(a <= b + 1e-12 for a, b in itertools.pairwise(values))


@given(st.lists(st.tuples(st.integers(1, 20), st.integers(0, 20)), min_size=1, max_size=60))
def test_mean_pass_at_k_is_the_exact_mean_of_every_tasks_pass_at_k(tasks):
    tasks = [(n, min(c, n)) for n, c in tasks]
    for row in mean_pass_at_k(tasks):
        reached = [(n, c) for n, c in tasks if n >= row["k"]]
        exact = sum(Fraction(pass_at_k(n, c, row["k"])) for n, c in reached) / len(reached)
        assert row["n_tasks"] == len(reached)
        assert row["pass_at_k"] == pytest.approx(float(exact), rel=1e-15)
