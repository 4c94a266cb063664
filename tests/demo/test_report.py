"""When the demo says LEARNED: a rise of the mean reward from the first fifth of policy versions to
the last that is both large enough and more than noise between versions explains."""

from __future__ import annotations

from trajlake.demo.report import LEARNING_MARGIN, LEARNING_T, fifths, rise_t


def test_a_steady_rise_is_many_standard_errors_and_a_flat_noisy_run_is_not() -> None:
    rising = [0.6 + 0.004 * v + (0.03 if v % 2 else -0.03) for v in range(60)]
    first, last = fifths(rising)
    assert last - first >= LEARNING_MARGIN and rise_t(rising) > LEARNING_T
    flat = [0.65 + (0.12 if v % 3 == 0 else -0.06) for v in range(60)]
    flat[-1] = 0.95  # one lucky version at the end moves the mean, not the test
    assert rise_t(flat) < LEARNING_T


def test_the_same_rise_with_wider_spread_between_versions_is_not_enough() -> None:
    tight = [0.6] * 12 + [0.7] * 36 + [0.75] * 12
    wide = [0.6 + (0.3 if v % 2 else -0.3) for v in range(12)] + [0.7] * 36
    wide += [0.75 + (0.3 if v % 2 else -0.3) for v in range(12)]
    assert rise_t(tight) > LEARNING_T > rise_t(wide)
