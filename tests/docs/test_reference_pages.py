"""The generated reference pages match the code, and the docs' blocks are marked as the suite runs them."""

from __future__ import annotations

import importlib.util

import pyarrow as pa

from tests.docs import blocks as md

_spec = importlib.util.spec_from_file_location("docs_reference", md.ROOT / "scripts" / "docs_reference.py")
assert _spec and _spec.loader
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)


def test_the_generated_reference_pages_are_current() -> None:
    """A new option, setting, event field or column shows in docs/reference/ once the pages are
    regenerated; until then this names the command that does it."""
    stale = [str(p.relative_to(md.ROOT)) for p in reference.stale_pages()]
    assert stale == [], f"{', '.join(stale)} out of date: run `{reference.REGENERATE}` (or `make docs`)"


def test_the_table_reference_lists_the_columns_the_sql_views_show(lake, bus, drain) -> None:
    """What `select *` returns from each view is what docs/reference/tables.md lists, in order."""
    from trajlake.ingest.recorder import Recorder
    from trajlake.schemas.tables import TOKEN_VIEW_COLUMNS
    from trajlake.store.tables import SCHEMAS

    with Recorder(bus, run_id="r", handle_signals=False).start("t") as traj:
        traj.turn([5, 6], [-0.5, -0.1], policy_version=0, input_token_ids=[1, 2])
        traj.finish("completed")
    drain()
    for table, schema in SCHEMAS.items():
        shown = lake.sql(f"select * from {table} limit 0").column_names
        assert shown == [*schema.names, *TOKEN_VIEW_COLUMNS.get(table, ())], table


def test_every_block_that_does_not_run_says_why_and_few_do_not() -> None:
    """A block left out of the suite carries its reason above its fence; a marker on a block the suite
    would not run anyway (text, JSON) is a mistake. Few are left out: most of those need a framework's
    venv, a vLLM fleet, a GPU or a fixed-port server, and name the test that runs the same path."""
    every = [b for p in md.pages() for b in md.blocks(p)]
    misplaced = [b.where for b in every if b.not_run is not None and b.kind is None]
    runnable = [b for b in every if b.kind]
    left_out = [b for b in runnable if b.not_run is not None]
    assert misplaced == []
    assert all(len(b.not_run or "") >= 15 for b in left_out)
    assert len(left_out) * 5 <= len(runnable) * 2, [b.where for b in left_out]


def test_a_marker_names_the_block_under_it(tmp_path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# p\n\n<!-- not-run: serves until it is stopped -->\n```bash\ntrajlake dashboard\n```\n\n"
        "```python\nprint(1)\n```\n\n```text\nout\n```\n\n<!-- save-as: rank.py -->\n```python\nprint(2)\n```\n"
    )
    found = [(b.line, b.kind, b.not_run, b.save_as) for b in md.blocks(page)]
    assert found == [
        (4, "shell", "serves until it is stopped", None),
        (8, "python", None, None),
        (12, None, None, None),
        (17, "python", None, "rank.py"),
    ]


def test_column_types_in_the_reference_read_as_sql_users_see_them() -> None:
    assert reference._type(pa.list_(pa.int32())) == "`list<int32>`"


def test_the_readme_is_a_front_door() -> None:
    """README.md: at most 150 lines, the two commands first, no dated run narration (figures live on
    docs/performance.md as tables, and that page carries no dates either)."""
    import re

    readme = (md.ROOT / "README.md").read_text()
    first = next(b for b in md.blocks(md.ROOT / "README.md"))
    assert len(readme.splitlines()) <= 150
    assert [line.split()[0] for line in first.code.splitlines()] == ["scripts/demo.sh", "scripts/test.sh"]
    dated = re.compile(r"\b20\d\d-\d\d-\d\d\b")
    for page in (md.ROOT / "README.md", md.ROOT / "docs" / "performance.md"):
        assert not dated.findall(page.read_text()), page.name


def test_the_cookbook_answers_at_least_twenty_questions_each_with_a_sample() -> None:
    cookbook = md.ROOT / "docs" / "how-to" / "sql-cookbook.md"
    found = md.blocks(cookbook)
    queries = [i for i, b in enumerate(found) if b.kind == "sql"]
    samples = [found[i + 1] for i in queries if i + 1 < len(found) and found[i + 1].language == "text"]
    assert len(queries) >= 20 and len(samples) == len(queries)
    assert all("row" in s.code for s in samples)  # a table as `trajlake sql` prints it: "(n rows)"
