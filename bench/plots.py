"""Draw the Performance page's figures from the benchmarks' JSON (never by hand).

    python bench/plots.py        # writes docs/img/scale-growth.svg and docs/img/ratios.svg

scale-growth: each figure of `bench/baselines/scale.json` (bench/scale.py's JSON) against the
run's size in tokens, as a multiple of its value at the smallest size: flat is what a lake should
do as a run grows. ratios: each benchmark's committed baseline ratios (trajlake against the plain
baseline measured beside it in the same run; `bench/baselines/<name>.json`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parent.parent
BASELINES = ROOT / "bench" / "baselines"
OUT = ROOT / "docs" / "img"
LABELS = {
    "catch_up_s": "projections catching up on 1,000 new trajectories",
    "point_lookup_warm_s": "one trajectory by id, with its tokens (warm)",
    "sampler_batch_s": "a new sampler's first batch",
}


def _save(fig: plt.Figure, name: str) -> Path:
    plt.rcParams["svg.hashsalt"] = "trajlake"  # stable element ids: the file changes only with its data
    path = OUT / name
    fig.savefig(path, format="svg", metadata={"Date": None}, bbox_inches="tight")
    plt.close(fig)
    return path


def scale_growth() -> Path:
    """Growth of each scale figure over the run's size, relative to the smallest size."""
    data = json.loads((BASELINES / "scale.json").read_text())
    sizes = data["sizes_tokens"]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for name, values in data["figures"].items():
        ax.plot(
            sizes,
            [v / values[0] for v in values],
            marker="o",
            label=f"{LABELS.get(name, name)} ({values[0]:g} s → {values[-1]:g} s)",
        )
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xscale("log")
    ax.set_xlabel("tokens in the run")
    ax.set_ylabel("× its time at the smallest size")
    ax.set_ylim(0, 2.5)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title("What grows as one run grows 100x (bench/scale.py)", fontsize=10)
    return _save(fig, "scale-growth.svg")


def ratios() -> Path:
    """Each benchmark's baseline ratios, one bar each (goal lines where the benchmark states one)."""
    bars = []
    for path in sorted(BASELINES.glob("*.json")):
        data = json.loads(path.read_text())
        for mode, run in sorted(data.get("runs", {}).items()):
            for key, value in run["ratios"].items():
                bars.append((f"{data['benchmark']} {key} ({mode})", value, run["figures"].get("goal_ratio")))
    fig, ax = plt.subplots(figsize=(7, 0.5 + 0.45 * len(bars)))
    ax.barh([b[0] for b in bars], [b[1] for b in bars], color="#4c72b0")
    for i, (_, value, goal) in enumerate(bars):
        ax.text(value, i, f" {value:.2f}", va="center", fontsize=8)
        if goal:
            ax.plot([goal, goal], [i - 0.4, i + 0.4], color="#c44e52")
    ax.axvline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xlabel("trajlake ÷ the plain baseline measured beside it (red: the goal)")
    ax.invert_yaxis()
    return _save(fig, "ratios.svg")


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for path in (scale_growth(), ratios()):
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
