"""What every benchmark shares: its options, its report, its JSON, its baseline check, its clean-up, its exit.

    from harness import Bench                     # bench/ is the script's own directory

    def main(argv=None) -> int:
        bench = Bench("sampler", __doc__, ratios={"ratio": "higher"})
        args = bench.parse(argv)                  # --quick, --json PATH, --check, --write-baseline
        with bench.scratch() as work:             # a temp dir, removed however the run ends
            result = {...figures..., "ratio": a / b}   # a and b measured side by side, in this run
        return bench.finish(args, result, "text to print")

    if __name__ == "__main__":
        run(main)

A benchmark's ratios compare what trajlake does with a plain baseline on the same data, in the
same run, so they hold across machines far better than absolute times. `--check` compares them
with the committed `bench/baselines/<name>.json` of the same mode (quick or full) and exits 1 when
one is worse than the baseline by more than `TOLERANCE`; `--write-baseline` records this run as
that baseline, with the machine it ran on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

BASELINES = Path(__file__).resolve().parent / "baselines"
TOLERANCE = 0.5
"""How much worse than its baseline a ratio may come out before `--check` fails: a half. Ratios
measured side by side on the shared two-core box moved by up to a third between runs of the same
code; a real regression of the kind these guard (a lost index, a copy of every token) costs more."""

Better = Literal["higher", "lower"]


def machine() -> dict[str, Any]:
    """The machine a figure was measured on: CPU, cores, memory, Python, and how fast a bare loop runs."""
    started = time.perf_counter()
    for _ in range(10_000_000):
        pass
    loop_s = time.perf_counter() - started
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory_gb = None
    with contextlib.suppress(OSError, ValueError):
        memory_gb = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    return {
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gb": memory_gb,
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
        "loop_10m_s": round(loop_s, 3),
    }


class Bench:
    """One benchmark: its name, the ratios it guards (and which way is better), its options."""

    def __init__(self, name: str, doc: str | None, ratios: Mapping[str, Better]) -> None:
        self.name = name
        self.ratios = dict(ratios)
        self.parser = argparse.ArgumentParser(description=(doc or name).splitlines()[0])
        self.parser.add_argument("--quick", action="store_true", help="a small run (under a minute)")
        self.parser.add_argument("--json", metavar="PATH", help="write the figures here")
        self.parser.add_argument(
            "--check",
            action="store_true",
            help=f"exit 1 when a ratio is more than {TOLERANCE:.0%}% worse than bench/baselines/{name}.json",  # %% for argparse
        )
        self.parser.add_argument(
            "--write-baseline", action="store_true", help=f"record this run as bench/baselines/{name}.json"
        )

    def parse(self, argv: list[str] | None = None) -> argparse.Namespace:
        """The options: the common ones, and any the benchmark added to `self.parser`."""
        return self.parser.parse_args(argv)

    @contextlib.contextmanager
    def scratch(self) -> Iterator[str]:
        """A temporary directory for the run's lakes, removed when the run ends, however it ends."""
        work = tempfile.mkdtemp(prefix=f"trajlake-bench-{self.name}-")
        try:
            yield work
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def finish(self, args: argparse.Namespace, result: dict[str, Any], report: str) -> int:
        """Print the report, write the JSON, check or record the baseline; return the exit code."""
        print(report)
        missing = [key for key in self.ratios if not isinstance(result.get(key), int | float)]
        if missing:
            raise KeyError(f"{self.name}: the result has no ratio {missing}")
        mode = "quick" if getattr(args, "quick", False) else "full"
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2))
        if args.write_baseline:
            self._write_baseline(mode, result)
        return self.check(mode, result) if args.check else 0

    def check(self, mode: str, result: Mapping[str, Any]) -> int:
        """Compare the result's ratios with the baseline of `mode`; print each; 1 if one regressed."""
        path = BASELINES / f"{self.name}.json"
        runs = json.loads(path.read_text())["runs"] if path.exists() else {}
        if mode not in runs:
            print(
                f"{self.name}: no {mode} baseline in {path}; record one with --write-baseline",
                file=sys.stderr,
            )
            return 1
        base, regressed = runs[mode], False
        for key, better in self.ratios.items():
            then, now = base["ratios"][key], float(result[key])
            worse = (then - now) / then if better == "higher" else (now - then) / then
            ok = worse <= TOLERANCE
            regressed |= not ok
            print(
                f"check {key}: {now:.3g} against the baseline's {then:.3g} ({better} is better; "
                f"{-worse:+.0%}, tolerance -{TOLERANCE:.0%}): {'ok' if ok else 'REGRESSED'}"
            )
        return 1 if regressed else 0

    def _write_baseline(self, mode: str, result: Mapping[str, Any]) -> None:
        path = BASELINES / f"{self.name}.json"
        baseline = json.loads(path.read_text()) if path.exists() else {"benchmark": self.name, "runs": {}}
        baseline["runs"][mode] = {
            "command": " ".join(["python", f"bench/{self.name}.py", *sys.argv[1:]]),
            "machine": machine(),
            "ratios": {key: float(result[key]) for key in self.ratios},
            "better": self.ratios,
            "figures": dict(result),
        }
        BASELINES.mkdir(exist_ok=True)
        path.write_text(json.dumps(baseline, indent=2) + "\n")
        print(f"wrote the {mode} baseline to {path}")


def run(main: Callable[[], int]) -> None:
    """Exit with `main`'s code at once: deltalake's runtime threads can abort an interpreter that tears
    down after a clean run, and the figures are written by then."""
    code = main()
    sys.stdout.flush()
    os._exit(code)
