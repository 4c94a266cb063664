"""Terminal output: a progress bar (plain lines when piped) and the one table printer.

The table printer fits the terminal the way DuckDB's shell does: long values and token-id lists
are shortened with "…", and a table wider than the terminal loses its middle columns, with a
note saying how many. Piped output keeps every column unless `max_width` says otherwise;
`max_width=0` cuts nothing anywhere (every column, whole values and lists). CSV ends its lines
with LF, as Unix tools expect.
"""

from __future__ import annotations

import decimal
import json
import shutil
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

FORMATS = ("table", "csv", "json")
MAX_CELL = 60  # characters of one value in a table before it is cut with "…"
NARROW_CELL = 20  # ... and in a table too wide for the terminal, as DuckDB's shell does
MAX_LIST = 8  # items of a list (token ids, logprobs) shown before "… (N items)"
SEPARATOR = " | "
ELIDED = "…"


class Progress:
    """Counts work done; draws a tqdm bar on a TTY, else prints a plain line now and then.

    A piped line is printed every `every` updates when given, else every `every_s` seconds, and
    once more on `close`; `update(**postfix)` figures (loss, reward) ride along on bar and line.
    """

    def __init__(
        self,
        total: int | None,
        desc: str,
        unit: str = "it",
        *,
        stream: TextIO | None = None,
        every: int | None = None,
        every_s: float = 5.0,
    ) -> None:
        self.total = total
        self.desc = desc
        self.unit = unit
        self.every = every
        self.every_s = every_s
        self.stream = stream or sys.stderr
        self.n = 0
        self.postfix = ""
        self._start = self._last = time.monotonic()
        self._printed = 0
        self._bar = None
        if getattr(self.stream, "isatty", lambda: False)():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream, dynamic_ncols=True)

    def update(self, n: int = 1, **postfix: Any) -> None:
        """Advance by `n`; `postfix` shows the latest figures."""
        self.n += n
        if postfix:
            self.postfix = " ".join(
                f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in postfix.items()
            )
        if self._bar is not None:
            if postfix:
                self._bar.set_postfix_str(self.postfix, refresh=False)
            self._bar.update(n)
        elif self._is_due():
            self._line()

    def _is_due(self) -> bool:
        if self.every is not None:
            return self.n - self._printed >= self.every
        return time.monotonic() - self._last >= self.every_s

    def _line(self) -> None:
        self._last, self._printed = time.monotonic(), self.n
        rate = self.n / max(self._last - self._start, 1e-9)
        of = f"/{self.total}" if self.total is not None else ""
        tail = f" {self.postfix}" if self.postfix else ""
        print(
            f"{self.desc}: {self.n}{of} {self.unit} ({_rate(rate)} {self.unit}/s){tail}",
            file=self.stream,
            flush=True,
        )

    def close(self) -> None:
        """Finish the bar, or print the last count if no line has shown it yet."""
        if self._bar is not None:
            self._bar.close()
        elif self._printed != self.n or self.n == 0:
            self._line()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _rate(per_s: float) -> str:
    """A rate readable at any size: 3,093 and 12 whole, 0.17 with two significant digits."""
    return f"{per_s:,.0f}" if per_s >= 10 else f"{per_s:.2g}"


def table_width(out: TextIO, max_width: int | None) -> int | None:
    """The width a table must fit: `max_width` (0: cut nothing), else the terminal's; None when
    piped (every column, values cut at MAX_CELL)."""
    if max_width is not None:
        return max_width
    if getattr(out, "isatty", lambda: False)():
        return shutil.get_terminal_size().columns
    return None


def write_table(
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    out: TextIO,
    fmt: str = "table",
    *,
    max_width: int | None = None,
    float_format: str = ".6g",
) -> None:
    """Print rows as an aligned text table, CSV, or a JSON list of row objects.

    Args:
        columns: the column names, one per value of each row.
        rows: the values; lists are shortened in a table, never in CSV or JSON.
        out: where to write.
        fmt: "table", "csv" or "json".
        max_width: the table's width limit; None fits a terminal and keeps every column when
            piped, 0 cuts nothing (columns, values or lists).
        float_format: how a table shows floats (CSV and JSON keep full precision).
    """
    if fmt == "json":
        json.dump([dict(zip(columns, row, strict=True)) for row in rows], out, default=json_default)
        out.write("\n")
    elif fmt == "csv":
        import csv

        writer = csv.writer(out, lineterminator="\n")  # the csv module's default is CRLF
        writer.writerow(columns)
        writer.writerows(["" if v is None else v for v in row] for row in rows)
    elif fmt == "table":
        out.writelines(
            line + "\n" for line in format_table(columns, rows, table_width(out, max_width), float_format)
        )
    else:
        raise ValueError(f"format must be one of {', '.join(FORMATS)} (got {fmt!r})")


def format_table(
    columns: Sequence[str], rows: Sequence[Sequence[Any]], width: int | None = None, float_format: str = ".6g"
) -> list[str]:
    """The lines of a text table no wider than `width`: header, rule, rows, and a row count.

    `width` None keeps every column (values still cut at MAX_CELL); 0 cuts nothing at all."""
    limit = None if width == 0 else MAX_CELL
    width = width or None
    header = [shorten(c, limit) for c in columns]
    cells = [[shorten(format_cell(v, float_format, whole=limit is None), limit) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(header)]
    right = [_is_numeric_column([r[i] for r in rows]) for i in range(len(header))]
    if width is not None and _total(widths, range(len(widths))) > width:
        widths = [min(w, max(NARROW_CELL, len(h))) for w, h in zip(widths, header, strict=True)]
    shown = _fitting_columns(widths, width)
    if width is not None and shown == [0]:
        widths[0] = min(widths[0], width)  # a single column: cut it to the width

    def line(values: Sequence[str]) -> str:
        parts = [ELIDED if i < 0 else _fit(values[i], widths[i], right[i]) for i in shown]
        return SEPARATOR.join(parts).rstrip()

    rule = "-+-".join("-" * (widths[i] if i >= 0 else len(ELIDED)) for i in shown)
    note = f"({len(rows)} row{'s' if len(rows) != 1 else ''}"
    hidden = len(header) - len([i for i in shown if i >= 0])
    if hidden:
        note += f", {hidden} of {len(header)} columns hidden; --max-width 0 shows all"
    return [line(header), rule, *(line(r) for r in cells), note + ")"]


def _fit(text: str, width: int, right: bool) -> str:
    """`text` padded (numbers to the right) or cut with "…" to exactly `width` characters."""
    if len(text) > width:
        return text[: width - 1] + ELIDED
    return text.rjust(width) if right else text.ljust(width)


def _fitting_columns(widths: list[int], width: int | None) -> list[int]:
    """Column indexes to show, with -1 where middle columns were elided (kept: the outer ones)."""
    if width is None or _total(widths, range(len(widths))) <= width:
        return list(range(len(widths)))
    left: list[int] = [0]
    right: list[int] = []
    for i in _outside_in(len(widths))[1:]:
        trial_left, trial_right = ([*left, i], right) if i < len(widths) / 2 else (left, [i, *right])
        if _total(widths, [*trial_left, -1, *trial_right]) > width:
            break
        left, right = trial_left, trial_right
    return [*left, -1, *right] if len(widths) > 1 else left


def _total(widths: list[int], shown: Iterable[int]) -> int:
    """The width of a table line showing columns `shown` (-1: the elision column)."""
    parts = [widths[i] if i >= 0 else len(ELIDED) for i in shown]
    return sum(parts) + len(SEPARATOR) * (len(parts) - 1)


def _outside_in(n: int) -> list[int]:
    """0, n-1, 1, n-2, …: the order in which columns earn a place."""
    order = []
    lo, hi = 0, n - 1
    while lo <= hi:
        order.append(lo)
        if hi != lo:
            order.append(hi)
        lo, hi = lo + 1, hi - 1
    return order


def format_cell(value: Any, float_format: str = ".6g", whole: bool = False) -> str:
    """One value as table text: NULL, floats in `float_format`, lists past MAX_LIST items cut
    (unless `whole`); list items as their own cells are (`[a, 1.5, NULL]`)."""
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return format(value, float_format)
    if isinstance(value, list) and (whole or len(value) <= MAX_LIST):
        return "[" + ", ".join(format_cell(item, float_format, whole) for item in value) + "]"
    if isinstance(value, list):
        tail = f", {ELIDED} ({len(value)} items)]"
        head = "["
        for item in value[:MAX_LIST]:
            text = format_cell(item, float_format)
            if len(head) + len(text) + 2 + len(tail) > MAX_CELL:  # the count must survive `shorten`
                break
            head += text if head == "[" else ", " + text
        return head + tail
    return str(value)


def shorten(text: str, limit: int | None = MAX_CELL) -> str:
    """`text` on one line, cut to `limit` characters (None: never) with a trailing "…"."""
    text = text.replace("\n", "\\n")
    return text if limit is None or len(text) <= limit else text[: limit - 1] + ELIDED


def _is_numeric_column(values: list[Any]) -> bool:
    """Numbers are right-aligned, as in DuckDB: a column with numbers and NULLs only."""
    present = [v for v in values if v is not None]
    return bool(present) and all(
        isinstance(v, int | float | decimal.Decimal) and not isinstance(v, bool) for v in present
    )


def json_default(value: Any) -> Any:
    """JSON for what `json` cannot write itself: whole Decimals as ints, times as ISO 8601, bytes as hex."""
    if isinstance(value, decimal.Decimal):  # DuckDB sums of integers are HUGEINT -> Decimal
        return int(value) if value == value.to_integral_value() else float(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    return str(value)
