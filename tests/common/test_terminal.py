"""The table printer and the progress reporter: what a user sees in a terminal or a pipe."""

from __future__ import annotations

import csv
import io
import json

import pytest

from trajlake.common.terminal import Progress, format_table, write_table

WIDE = [f"column_{i:02d}" for i in range(20)]


class Tty(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_a_table_that_fits_shows_every_column_with_numbers_to_the_right() -> None:
    lines = format_table(["status", "n"], [["completed", 12], ["error", 3]], width=80)
    assert lines == [
        "status    |  n",
        "----------+---",
        "completed | 12",
        "error     |  3",
        "(2 rows)",
    ]


def test_a_wide_table_keeps_the_outer_columns_and_says_how_many_it_hid() -> None:
    lines = format_table(WIDE, [list(range(20))], width=60)
    assert all(len(line) <= 60 for line in lines[:-1])
    header = lines[0].split(" | ")
    assert header[0] == "column_00" and header[-1] == "column_19" and "…" in header
    shown = len(header) - 1
    assert lines[-1] == f"(1 row, {20 - shown} of 20 columns hidden; --max-width 0 shows all)"


def test_long_values_and_token_lists_are_shortened_with_an_ellipsis() -> None:
    tokens = list(range(1000, 3000))
    lines = format_table(["text", "token_ids"], [["x" * 500, tokens]])
    text, token_ids = lines[2].split(" | ")
    assert len(text) == 60 and text.endswith("…")
    assert token_ids.startswith("[1000, 1001,") and token_ids.endswith("… (2000 items)]")


@pytest.mark.parametrize(
    ("stream", "max_width", "cut"),
    [(io.StringIO(), None, False), (Tty(), None, True), (io.StringIO(), 60, True), (Tty(), 0, False)],
    ids=["piped-whole", "terminal-fitted", "max-width", "max-width-0-whole"],
)
def test_width_comes_from_the_terminal_or_max_width(stream, max_width, cut, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    write_table(WIDE, [list(range(20))], stream, max_width=max_width)
    assert ("columns hidden" in stream.getvalue()) is cut


def test_csv_and_json_keep_every_column_and_full_values() -> None:
    rows = [["a", 1.23456789, list(range(20))], ["b", None, []]]
    out = io.StringIO()
    write_table(["k", "x", "ids"], rows, out, "json", max_width=10)
    assert json.loads(out.getvalue())[0] == {"k": "a", "x": 1.23456789, "ids": list(range(20))}
    out = io.StringIO()
    write_table(["k", "x", "ids"], rows, out, "csv", max_width=10)
    got = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert got[0]["x"] == "1.23456789" and got[1]["x"] == ""


def test_piped_progress_prints_plain_lines_with_the_latest_figures() -> None:
    out = io.StringIO()
    progress = Progress(7, "train", "steps", stream=out, every=5)
    for step in range(7):
        progress.update(loss=1.0 / (step + 1))
    progress.close()
    lines = out.getvalue().splitlines()
    assert [line.split(" steps")[0] for line in lines] == ["train: 5/7", "train: 7/7"]
    assert lines[-1].endswith("loss=0.143")


def test_progress_on_a_terminal_draws_a_bar_instead_of_lines() -> None:
    out = Tty()
    with Progress(3, "compact", unit="tables", stream=out) as progress:
        progress.update(3)
    assert "compact" in out.getvalue() and "3/3" in out.getvalue() and "tables/s)" not in out.getvalue()


def test_a_slow_progress_shows_its_rate_not_zero(monkeypatch) -> None:
    from trajlake.common import terminal

    now = [100.0]
    monkeypatch.setattr(terminal.time, "monotonic", lambda: now[0])
    out = io.StringIO()
    progress = Progress(2, "train", "steps", stream=out, every=1)
    now[0] += 6.0  # one step in 6 s
    progress.update()
    assert "(0.17 steps/s)" in out.getvalue()


def test_csv_lines_end_with_lf_not_crlf() -> None:
    """An id captured with `$(trajlake sql --format csv … | tail -1)` kept a `\\r`, and the next
    query silently matched nothing."""
    out = io.StringIO(newline="")  # keeps what was written: no newline translation
    write_table(["trajectory_id", "note"], [["t-1", "two\nlines"], ["t-2", None]], out, "csv")
    text = out.getvalue()
    assert "\r" not in text.replace('"two\nlines"', "")
    assert text.splitlines()[-1] == "t-2," and text.endswith("t-2,\n")
    assert list(csv.reader(io.StringIO(text)))[1] == ["t-1", "two\nlines"]


@pytest.mark.parametrize("stream", [io.StringIO(), Tty()], ids=["piped", "terminal"])
def test_max_width_0_cuts_no_column_value_or_list(stream, monkeypatch) -> None:
    """Cells were cut at 60 characters even with --max-width 0, which the help calls never."""
    monkeypatch.setenv("COLUMNS", "80")
    text, tokens = "x" * 500, list(range(1000, 3000))
    write_table([*WIDE, "text", "token_ids"], [[*range(20), text, tokens]], stream, max_width=0)
    lines = stream.getvalue().splitlines()
    assert "…" not in stream.getvalue()
    assert lines[0].split(" | ")[0] == "column_00" and lines[0].split()[-1] == "token_ids"
    cells = lines[2].split(" | ")
    assert cells[-2].strip() == text and cells[-1] == str(tokens)
    assert lines[-1] == "(1 row)"


def test_a_list_shows_its_items_as_cells_whatever_its_length() -> None:
    (line,) = format_table(["a", "b"], [[["x", 1.5, None], ["y"] * 20]], width=None)[2:3]
    short, long = line.split(" | ")
    assert short.strip() == "[x, 1.5, NULL]" and long.startswith("[y, y, y,")
