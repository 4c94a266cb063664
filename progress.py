"""Progress reporting: a bar on a terminal, plain lines when output is piped."""

from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    """Counts work done; draws a tqdm bar on a TTY, else prints a line every `every_s` seconds."""

    def __init__(
        self, total: int | None, desc: str, unit: str = "it", every_s: float = 5.0, stream: Any = None
    ) -> None:
        self.total = total
        self.desc = desc
        self.unit = unit
        self.every_s = every_s
        self.stream = stream or sys.stderr
        self.n = 0
        self._last = time.monotonic()
        self._start = self._last
        self._bar = None
        if getattr(self.stream, "isatty", lambda: False)():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream, dynamic_ncols=True)

    def update(self, n: int = 1) -> None:
        """Advance by `n`."""
        self.n += n
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            self._line()

    def _line(self) -> None:
        rate = self.n / max(time.monotonic() - self._start, 1e-9)
        of = f"/{self.total}" if self.total is not None else ""
        print(
            f"{self.desc}: {self.n}{of} {self.unit} ({rate:,.0f} {self.unit}/s)", file=self.stream, flush=True
        )

    def close(self) -> None:
        """Finish the bar, or print a final line."""
        if self._bar is not None:
            self._bar.close()
        else:
            self._line()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
