"""Health signals of a run: the patterns that come before a failed RL run, per window of steps.

Six signals, each judged per window of `HealthSettings.window` trainer steps (figures of the
rollouts: per window of policy versions) against the run's own start, so a threshold means the
same for a tiny policy and a large model:

- entropy collapse: the trainer's entropy (else −mean sampled logprob) falls fast or far;
- mismatch acceleration: train/inference logprob mismatch above its healthy level and growing
  by a factor per window;
- reward–length: reward rising with output length alone (length exploitation): tokens per turn,
  compared among samples of one prompt that took as many turns, so an agent that learns to take
  a step more (a tool call before the answer) is not mistaken for one padding its answers;
- advantage drift: advantages no longer centred on 0, or their spread collapsing;
- tool-error spikes: a window's tool error rate well above the run's earlier rate;
- garbled output: turns repeating their own 4-grams (every turn: `turns.output_repetition`),
  or decoding to unprintable text (a sample: each window's latest turns).

`diagnose_health` reads the lake (SQL with parameters only) and returns a `HealthReport` that
`trajlake doctor` prints and the dashboard's Health page draws. An alert names the first step
(or policy version) of the window where the signal first crossed its threshold.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from trajlake.store.config import HealthSettings
from trajlake.store.summaries import REPETITION_NGRAM

OK, ALERT, NOT_RECORDED = "ok", "alert", "not recorded"
STEP, VERSION = "step", "policy version"

TRAINER_SQL = """
with consumed as (select distinct step from batch_consumption where run_id = $run)
select s.step, avg(s.entropy) filter (where c.step is not null or not exists (from consumed)) as entropy,
  avg(s.mismatch) as mismatch
from trainer_steps s left join consumed c on c.step = s.step
where s.run_id = $run group by s.step order by s.step
"""
"""The trainer's figures per step. `entropy` only of steps that took a new batch, when the run
records what it consumed: a step that trains again on a batch it used (the overfit check) measures
how well it fits that batch, not the policy's entropy. `mismatch` is the engine mismatch only
(tokens of the weights the trainer held); the policy's drift (`trainer_steps.drift`) is no fault:
training on older samples is what makes it."""

ROLLOUT_ENTROPY_SQL = """
select policy_version as x, -sum(sum_logprob) / nullif(sum(n_output_tokens), 0) as entropy
from _t_turns where run_id = $run and policy_version is not null and sum_logprob is not null
group by x order by x
"""

VERSION_STEPS_SQL = """
select trainer_version as version, min(step) as step from trainer_steps
where run_id = $run and trainer_version is not null group by 1
"""

REWARD_LENGTH_SQL = """
with scored as (
  select policy_version_min // $w * $w as start, coalesce(group_id, trajectory_id) as prompt, n_turns, reward,
    assistant_tokens::double / n_turns as per_turn
  from _t_trajectories
  where run_id = $run and finished and reward is not null and coalesce(failure_origin, '') <> 'system'
    and policy_version_min is not null and n_turns > 0
), paired as (
  select *, min(reward) over alike < max(reward) over alike as varies,
    reward - avg(reward) over alike as reward_dev, per_turn - avg(per_turn) over alike as length_dev
  from scored window alike as (partition by start, prompt, n_turns)
)
select start, count(*) as n, avg(reward) as reward, avg(per_turn) as tokens_per_turn, avg(n_turns) as turns,
  count(*) filter (where varies) as n_alike,
  sum(reward_dev * length_dev) filter (where varies) / nullif(sqrt(
    sum(reward_dev * reward_dev) filter (where varies) * sum(length_dev * length_dev) filter (where varies)), 0)
    as corr_alike
from paired group by start order by start
"""
"""Per window: reward, tokens per turn, and their correlation among like samples: the deviations of
each from the mean of the samples of one prompt that took as many turns (a pooled within-stratum
correlation over the strata whose rewards differ: a stratum scored alike says nothing about what
the reward follows)."""

ADVANTAGE_SQL = """
select step // $w * $w as start, count(*) as n, count(advantage) as n_advantages,
  avg(advantage) as mean, avg(abs(advantage)) as abs_mean, stddev_pop(advantage) as std
from batch_consumption where run_id = $run group by start order by start
"""

# From the trajectories' tool counts (the projection of `tool_calls`, as the Behaviour page's
# tool success rate), so no join with the much longer `tool_calls` table.
TOOL_ERRORS_SQL = """
select policy_version_min // $w * $w as start, sum(n_tool_calls)::bigint as calls,
  sum(n_tool_errors)::bigint as errors
from _t_trajectories where run_id = $run and policy_version_min is not null and n_tool_calls > 0
group by start order by start
"""

GARBLED_SQL = """
select policy_version // $w * $w as start, count(output_repetition) as turns,
  count(*) filter (where output_repetition > $max_repetition) as repeating,
  avg(output_repetition) as repetition, count(*) filter (where output_repetition is null) as unscored
from _t_turns where run_id = $run and policy_version is not null and n_output_tokens >= $min_tokens
group by start order by start
"""

# The unprintable-text sample: per window, the time span at its end that holds about
# `per_window` turns (at the window's average rate). The token lists of just that span are read
# from the `events` files whose event times overlap it (the Delta log's statistics), so the check
# opens a few files per window however many the run has.
SAMPLE_SPANS_SQL = """
select policy_version // $w * $w as start, max(event_time) as hi,
  to_timestamp(epoch(max(event_time))
               - (epoch(max(event_time)) - epoch(min(event_time))) * least(1.0, $per_window / count(*))) as lo
from _t_turns where run_id = $run and policy_version is not null
group by start order by start
"""

SAMPLE_WHERE = """
run_id = $run and event_type = 'turn' and event_time between $lo and $hi
  and policy_version // $w * $w = $start and len(output_token_ids) >= $min_tokens
"""
"""One window's turns in its span, read from the `events` files whose times overlap the span."""

RESCORE = "turns projected before their repetition was recorded: `trajlake rebuild` scores them"


MODEL_SQL = """
select model from _t_trajectories where run_id = $run and model is not null
group by model order by count(*) desc limit 1
"""

Decoder = Callable[[Sequence[int]], str]


@dataclass
class Alert:
    """A signal crossed its threshold: where it began (`start` on `axis`) and what was seen."""

    signal: str
    axis: str
    start: int
    step: int | None
    """The trainer step: `start` itself, or on the policy-version axis the step that trained that version."""
    message: str


@dataclass
class Signal:
    """One health signal of a run: its figures per window, and its alert if it raised one."""

    name: str
    title: str
    axis: str
    threshold: str
    status: str = OK
    note: str = ""
    windows: list[dict[str, Any]] = field(default_factory=list)
    alert: Alert | None = None


@dataclass
class HealthReport:
    """Every signal of one run; `alerts` are the ones that fired."""

    run_id: str
    window: int
    signals: list[Signal] = field(default_factory=list)

    @property
    def alerts(self) -> list[Alert]:
        return [s.alert for s in self.signals if s.alert is not None]

    def signal(self, name: str) -> Signal:
        return next(s for s in self.signals if s.name == name)

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "window": self.window, "signals": [asdict(s) for s in self.signals],
                "alerts": [asdict(a) for a in self.alerts]}  # fmt: skip


def diagnose_health(
    lake: Any, run_id: str, settings: HealthSettings | None = None, tokenizer: str | None = None
) -> HealthReport:
    """Compute every health signal of `run_id` (read-only).

    Args:
        lake: the `Lake`.
        run_id: the run.
        settings: the thresholds (default: `HealthSettings()`).
        tokenizer: a local tokenizer directory for the unprintable-text check (default: the
            run's recorded model, when that is a local directory; else only repetition is checked).
    """
    run = RunFigures(lake, run_id, settings or HealthSettings(), tokenizer)
    run.trainer = run.rows(TRAINER_SQL)
    run.version_steps = {r["version"]: r["step"] for r in run.rows(VERSION_STEPS_SQL)}
    return HealthReport(run_id, run.settings.window, [signal(run) for signal in SIGNALS])


@dataclass
class RunFigures:
    """What every signal reads: the lake and run, the thresholds, and the trainer's figures per step."""

    lake: Any
    run_id: str
    settings: HealthSettings
    tokenizer: str | None
    trainer: list[dict[str, Any]] = field(default_factory=list)
    version_steps: dict[int, int] = field(default_factory=dict)
    """Policy version → the trainer step whose update produced it."""

    def rows(self, sql: str, **params: Any) -> list[dict[str, Any]]:
        """The rows of `sql` for this run (`$run`), with `params` bound as DuckDB parameters."""
        return self.lake.sql(sql, {"run": self.run_id, **params}).to_pylist()

    def alert(self, sig: Signal, start: int, what: str) -> None:
        """Mark `sig` alerted at the window starting at `start` (the first crossing wins)."""
        if sig.alert is not None:
            return
        step = start if sig.axis == STEP else self.version_steps.get(start)
        where = f"{sig.axis}s {start}–{start + self.settings.window - 1}"
        if sig.axis != STEP and step is not None:
            where += f" (trained from step {step})"
        sig.alert = Alert(sig.name, sig.axis, start, step, f"{sig.title} from {where}: {what}")
        sig.status = ALERT


def _windows(points: list[tuple[int, float]], window: int) -> list[tuple[int, list[tuple[int, float]]]]:
    """(first x of the window, its points) for windows of `window` x values aligned at 0, in order."""
    out: dict[int, list[tuple[int, float]]] = {}
    for x, y in points:
        out.setdefault(x // window * window, []).append((x, y))
    return sorted(out.items())


def _slope(points: list[tuple[int, float]]) -> float | None:
    """The least-squares slope of y over x (None under three points)."""
    if len(points) < 3:
        return None
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else None


def _growth(value: float | None, base: float | None) -> float | None:
    return value / base - 1 if value is not None and base else None


# -- the signals -------------------------------------------------------------------------------


def entropy_collapse(run: RunFigures) -> Signal:
    """Entropy falling faster than `entropy_drop_per_step` of the start per step, or below `entropy_floor`.

    The fall is the least-squares slope over a complete window; the run's last window, while
    short of `window` steps, is judged on its level only. After the first window, a steep slope
    counts only when the window's mean also fell from the previous window's by at least half of
    what that rate takes off in a window: per-step entropy of small batches is noisy, and a dip
    within a window that leaves the level where it was is no collapse.
    """
    s = run.settings
    sig = Signal("entropy_collapse", "entropy collapse", STEP,
                 f"falls > {s.entropy_drop_per_step:.0%} of the start per step, or below {s.entropy_floor:.0%} of it")  # fmt: skip
    points = [(r["step"], r["entropy"]) for r in run.trainer if r["entropy"] is not None]
    if not points:
        sig.axis, sig.note = VERSION, "trainer recorded no entropy: −mean logprob of sampled tokens"
        points = [(r["x"], r["entropy"]) for r in run.rows(ROLLOUT_ENTROPY_SQL)]
    if not points:
        sig.status, sig.note = NOT_RECORDED, "no entropy and no sampled logprobs recorded"
        return sig
    base: float | None = None
    previous: float | None = None
    windows = _windows(points, s.window)
    for start, pts in windows:
        mean = sum(y for _, y in pts) / len(pts)
        base = mean if base is None else base
        # The slope of a window still filling (the run's last, short of `window` points) rests on
        # fewer points than the threshold was set for; it is judged when the window is complete.
        complete = start != windows[-1][0] or len(pts) == s.window
        slope = _slope(pts) if complete else None
        drop = -slope / base if slope is not None and base > 0 else None
        level = mean / base if base > 0 else None
        fell = (previous - mean) / base if previous is not None and base > 0 else None
        sig.windows.append({"start": start, "points": len(pts), "entropy": mean, "slope": slope,
                            "drop_per_step": drop, "of_start": level, "fell": fell})  # fmt: skip
        lasting = fell is None or fell >= s.entropy_drop_per_step * s.window / 2
        if drop is not None and drop > s.entropy_drop_per_step and lasting:
            run.alert(sig, start, f"falling {drop:.0%} of the start ({base:.3g}) per step")
        elif level is not None and level < s.entropy_floor:
            run.alert(sig, start, f"mean {mean:.3g} is {level:.0%} of the start ({base:.3g})")
        previous = mean
    return sig


def mismatch_acceleration(run: RunFigures) -> Signal:
    """Train/inference mismatch above `mismatch_floor` and `mismatch_growth` times the previous window's."""
    s = run.settings
    sig = Signal("mismatch_acceleration", "mismatch acceleration", STEP,
                 f"above {s.mismatch_floor:g} and ≥ {s.mismatch_growth:g}× the previous window")  # fmt: skip
    points = [(r["step"], r["mismatch"]) for r in run.trainer if r["mismatch"] is not None]
    if not points:
        sig.status, sig.note = NOT_RECORDED, "the trainer recorded no train/inference mismatch"
        return sig
    previous = None
    for start, pts in _windows(points, s.window):
        mean = sum(y for _, y in pts) / len(pts)
        growth = mean / previous if previous else None
        sig.windows.append({"start": start, "points": len(pts), "mismatch": mean, "growth": growth})
        if growth is not None and mean > s.mismatch_floor and growth >= s.mismatch_growth:
            run.alert(sig, start, f"mean {mean:.3g}, {growth:.1f}× the previous window's {previous:.3g}")
        previous = mean
    return sig


def reward_length(run: RunFigures) -> Signal:
    """Reward correlated with tokens per turn among like samples (one prompt, as many turns) while
    tokens per turn grow and reward rises: reward that follows output length alone.

    Length that comes with a different behaviour (more turns: a tool call before the answer) is
    compared with its like only, so an agent learning to use a tool does not raise it.
    """
    s = run.settings
    sig = Signal("reward_length", "reward–length correlation", VERSION,
                 f"corr ≥ {s.reward_length_corr:g} with tokens per turn among samples of a prompt with as many "
                 f"turns, tokens per turn +{s.length_growth:.0%} since the start")  # fmt: skip
    rows = [r for r in run.rows(REWARD_LENGTH_SQL, w=s.window) if r["n"] >= s.min_samples]
    if not rows:
        sig.status, sig.note = NOT_RECORDED, f"no window with {s.min_samples} scored trajectories"
        return sig
    base = rows[0]
    for r in rows:
        grown = _growth(r["tokens_per_turn"], base["tokens_per_turn"])
        sig.windows.append({**r, "growth": grown})
        corr = r["corr_alike"]
        judged = r["n_alike"] >= s.min_samples and corr is not None and grown is not None
        if (
            judged
            and r["reward"] > base["reward"]
            and corr >= s.reward_length_corr
            and grown >= s.length_growth
        ):
            run.alert(sig, r["start"], f"reward {r['reward']:.3g} (start {base['reward']:.3g}) rises with tokens per "
                      f"turn among like samples: corr {corr:.2f} over {r['n_alike']}, {r['tokens_per_turn']:.3g} "
                      f"tokens per turn (start {base['tokens_per_turn']:.3g})")  # fmt: skip
    return sig


def advantage_drift(run: RunFigures) -> Signal:
    """Advantages no longer centred on 0 (|mean| / mean |a|), or their std collapsing from the start's."""
    s = run.settings
    sig = Signal("advantage_drift", "advantage drift", STEP,
                 f"|mean|/mean|a| > {s.advantage_mean_ratio:g}, or std < {s.advantage_std_floor:.0%} of the start")  # fmt: skip
    rows = [r for r in run.rows(ADVANTAGE_SQL, w=s.window) if r["n_advantages"]]
    if not rows:
        sig.status, sig.note = (
            NOT_RECORDED,
            "the trainer recorded no advantages (batch_consumption.advantage)",
        )
        return sig
    base_std = rows[0]["std"]
    for r in rows:
        ratio = abs(r["mean"]) / r["abs_mean"] if r["abs_mean"] else None
        spread = r["std"] / base_std if base_std else None
        sig.windows.append({**r, "mean_ratio": ratio, "std_of_start": spread})
        if ratio is not None and ratio > s.advantage_mean_ratio:
            run.alert(sig, r["start"], f"mean {r['mean']:.3g} against mean |a| {r['abs_mean']:.3g}")
        elif spread is not None and spread < s.advantage_std_floor:
            run.alert(sig, r["start"], f"std {r['std']:.3g}, {spread:.0%} of the start's {base_std:.3g}")
    return sig


def tool_error_spikes(run: RunFigures) -> Signal:
    """A window's tool error rate above the rate of all earlier windows by an amount and a z-score."""
    s = run.settings
    sig = Signal("tool_error_spike", "tool-error spike", VERSION,
                 f"error rate +{s.tool_error_increase:g} over earlier windows and z ≥ {s.tool_error_z:g}")  # fmt: skip
    rows = run.rows(TOOL_ERRORS_SQL, w=s.window)
    if not rows:
        sig.status, sig.note = NOT_RECORDED, "no tool calls recorded"
        return sig
    calls = errors = 0
    for r in rows:
        rate = r["errors"] / r["calls"]
        earlier = errors / calls if calls else None
        z = None
        if earlier is not None and 0 < earlier < 1:
            z = (rate - earlier) / math.sqrt(earlier * (1 - earlier) / r["calls"])
        sig.windows.append({**r, "error_rate": rate, "earlier_rate": earlier, "z": z})
        judged = earlier is not None and r["calls"] >= s.min_samples and calls >= s.min_samples
        if judged and rate - earlier >= s.tool_error_increase and (z is None or z >= s.tool_error_z):
            run.alert(sig, r["start"], f"error rate {rate:.0%} against {earlier:.0%} before")
        calls, errors = calls + r["calls"], errors + r["errors"]
    return sig


def garbled_output(run: RunFigures) -> Signal:
    """Per window, the share of turns that repeat their own 4-grams (every turn), or of sampled
    turns that decode to unprintable text, whichever is larger."""
    s = run.settings
    sig = Signal("garbled_output", "garbled output", VERSION,
                 f"> {s.garbled_share:.0%} of turns repeat > {s.max_repetition:.0%} of their {REPETITION_NGRAM}-grams"
                 f" or are > {s.max_nonprintable:.0%} unprintable")  # fmt: skip
    rows = run.rows(GARBLED_SQL, w=s.window, min_tokens=s.garbled_min_tokens, max_repetition=s.max_repetition)
    unscored = any(r["unscored"] for r in rows)
    if not any(r["turns"] for r in rows):
        sig.status = NOT_RECORDED
        sig.note = RESCORE if unscored else f"no turn has {s.garbled_min_tokens}+ output tokens"
        return sig
    decode = run_decoder(run)
    unprintable_by_window: dict[int, list[float]] = {}
    if decode is not None:
        for t in sample_tokens(run):
            text = decode(t["output_token_ids"] or [])
            unprintable_by_window.setdefault(t["start"], []).append(unprintable(text))
    sig.note = (
        "repetition and unprintable text" if decode else "repetition only: no local tokenizer for the run"
    )
    if unscored:
        sig.note += f"; {RESCORE}"
    for r in rows:
        start, turns = r["start"], r["turns"]
        texts = unprintable_by_window.get(start, [])
        unreadable = sum(u > s.max_nonprintable for u in texts)
        share_repeating = r["repeating"] / turns if turns else 0.0
        share_unreadable = unreadable / len(texts) if texts else 0.0
        sig.windows.append({"start": start, "turns": turns, "repeating": r["repeating"],
                            "sampled": len(texts), "unreadable": unreadable,
                            "share": max(share_repeating, share_unreadable), "repetition": r["repetition"],
                            "unprintable": sum(texts) / len(texts) if texts else None})  # fmt: skip
        if turns >= s.min_samples and share_repeating > s.garbled_share:
            run.alert(sig, start, f"{r['repeating']} of {turns} turns repeat their {REPETITION_NGRAM}-grams"
                                  f" ({share_repeating:.0%})")  # fmt: skip
        elif len(texts) >= s.min_samples and share_unreadable > s.garbled_share:
            run.alert(
                sig, start, f"{unreadable} of {len(texts)} sampled turns unprintable ({share_unreadable:.0%})"
            )
    return sig


SIGNALS: tuple[Callable[[RunFigures], Signal], ...] = (
    entropy_collapse, mismatch_acceleration, reward_length, advantage_drift, tool_error_spikes, garbled_output,
)  # fmt: skip
"""Every signal, in the order reports show them."""


def sample_tokens(run: RunFigures) -> list[dict[str, Any]]:
    """The output token ids of each window's latest `garbled_sample` turns that have `garbled_min_tokens`."""
    s = run.settings
    turns = []
    for span in run.rows(SAMPLE_SPANS_SQL, w=s.window, per_window=s.garbled_sample):
        params = {"run": run.run_id, "w": s.window, "min_tokens": s.garbled_min_tokens} | span
        # a few files per window, however long the run: the view would check every file's footer
        ids = run.lake.read(
            "events",
            ["output_token_ids"],
            SAMPLE_WHERE,
            params,
            within=("event_time", span["lo"], span["hi"]),
        ).column(0)
        turns += [
            {"start": span["start"], "output_token_ids": t} for t in ids[: s.garbled_sample].to_pylist()
        ]
    return turns


def unprintable(text: str) -> float:
    """The share of characters that are neither printable nor whitespace (U+FFFD counts as unprintable)."""
    if not text:
        return 0.0
    bad = sum(1 for c in text if c == "\ufffd" or not (c.isprintable() or c.isspace()))
    return bad / len(text)


def run_decoder(run: RunFigures) -> Decoder | None:
    """The decoder of the run's recorded model, or of the `tokenizer` given; None when the model's
    does not load (only repetition is checked then). A `tokenizer` that does not load raises
    `TokenizerNotFound`: the user named it, so the message says the fix."""
    from trajlake.store.tokenizer import TokenizerNotFound, find_decoder

    rows = run.rows(MODEL_SQL)
    model = rows[0]["model"] if rows else None
    if run.tokenizer:
        return find_decoder(model, run.tokenizer)
    try:
        return find_decoder(model)
    except TokenizerNotFound:
        return None


def render_health(report: HealthReport) -> list[str]:
    """The signals as text lines for `trajlake doctor`: one line each, then the alerts."""
    w = report.window
    lines = [f"health signals (per window of {w} steps, or of {w} policy versions for rollout figures):"]
    for sig in report.signals:
        if sig.status == NOT_RECORDED:
            detail = sig.note
        else:
            detail = f"threshold: {sig.threshold}" + (f" ({sig.note})" if sig.note else "")
        lines.append(f"  {sig.title:<26} {sig.status.upper() if sig.alert else sig.status:<13} {detail}")
    return lines + [f"  ALERT {a.message}" for a in report.alerts]
