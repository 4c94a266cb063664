"""Reads that open only the files that may hold what they look for, by the Delta log's statistics:
one trajectory by id (`Lake.trajectory`), a span of event times (`Lake.read(within=...)`) and the
rows of some ids (`Lake.read(among=...)`)."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.rollout.loadgen import LoadgenConfig, generate
from trajlake.store.lake import Lake
from trajlake.store.reads import connection

RUN = "prune"
COMMITS = 6


@pytest.fixture(scope="module")
def many_files(tmp_path_factory):
    """One run committed in COMMITS sink runs (so every table has COMMITS files), plus a second
    run that reuses none of its ids (shared, read-only)."""
    lake, bus = Lake(tmp_path_factory.mktemp("prune") / "lake"), InProcessBus()
    for i in range(COMMITS):
        generate(bus, LoadgenConfig(trajectories=6, seed=i, run_id=RUN, first_group=i * 100))
        DeltaSink(lake, bus, SinkConfig()).run(until_idle_s=0.0)
    generate(bus, LoadgenConfig(trajectories=4, seed=99, run_id="other"))
    DeltaSink(lake, bus, SinkConfig()).run(until_idle_s=0.0)
    yield lake
    lake.close()


def ids(lake: Lake) -> list[str]:
    return (
        lake.sql(
            "select trajectory_id from trajectories where run_id = $run order by started_at", {"run": RUN}
        )
        .column(0)
        .to_pylist()
    )


def test_a_trajectory_is_read_from_the_files_that_hold_it_and_equals_the_view(many_files):
    assert len(many_files.files("events")) > COMMITS
    for tid in ids(many_files)[:: len(ids(many_files)) // 5]:
        assert len(many_files.files_within("events", "trajectory_id", tid, tid)) == 1
        assert len(many_files.files_within("trajectories", "trajectory_id", tid, tid)) == 1
        looked_up = many_files.trajectory(tid)
        viewed = many_files.sql("select * from trajectories where trajectory_id = $id", {"id": tid})
        assert looked_up.num_rows == 1
        assert looked_up.to_pylist() == viewed.to_pylist()  # every scalar and the token lists


def test_footers_stay_cached_for_lookups_but_not_for_the_sinks_reads(many_files):
    """The lookup turns DuckDB's Parquet metadata cache on for its own cursor: the projections'
    reads on the process's other cursors (every new file, once) do not fill it."""
    tid = ids(many_files)[0]
    assert many_files.trajectory(tid).num_rows == 1
    con = connection()
    try:
        assert con.execute("select current_setting('parquet_metadata_cache')").fetchall() == [(False,)]
    finally:
        con.close()
    assert many_files.trajectory(tid).to_pylist() == many_files.trajectory(tid).to_pylist()


def test_an_unknown_id_reads_no_file_and_finds_nothing(many_files):
    assert many_files.files_within("events", "trajectory_id", "zzzz", "zzzz") == []
    assert many_files.trajectory("zzzz").num_rows == 0


def test_run_id_picks_the_run_of_an_id(many_files):
    tid = ids(many_files)[0]
    assert many_files.trajectory(tid, run_id=RUN).num_rows == 1
    assert many_files.trajectory(tid, run_id="other").num_rows == 0


def test_event_times_are_in_the_delta_log_so_a_span_reads_its_own_files(many_files):
    times = many_files.sql(
        "select trajectory_id, min(event_time) as lo, max(event_time) as hi from events "
        "where run_id = $run and trajectory_id is not null group by 1 order by lo",
        {"run": RUN},
    ).to_pylist()
    first, last = times[0], times[-1]
    early = many_files.files_within("events", "event_time", first["lo"], first["hi"])
    late = many_files.files_within("events", "event_time", last["lo"], last["hi"])
    assert early and late and not set(early) & set(late)
    rows = many_files.read(
        "events", ["trajectory_id"], "event_time between $lo and $hi", {"lo": last["lo"], "hi": last["hi"]},
        within=("event_time", last["lo"], last["hi"]),
    )  # fmt: skip
    assert last["trajectory_id"] in rows.column(0).to_pylist()
    after = last["hi"] + timedelta(days=1)
    assert many_files.files_within("events", "event_time", after, after) == []


def test_rows_among_some_ids_are_read_from_the_files_of_their_range_and_equal_an_unpruned_read(
    many_files, monkeypatch
):
    from trajlake.store import reads

    every = ids(many_files)
    chosen = every[-7:-1:2]  # three late trajectories: their range spans the last commits' files
    opened: list[list[str] | None] = []
    real = reads.read_files

    def spy(lake, name, columns, where, params, files, **kw):
        opened.append(files)
        return real(lake, name, columns, where, params, files, **kw)

    monkeypatch.setattr(reads, "read_files", spy)
    columns, order = (
        ["trajectory_id", "seq", "event_type"],
        [("trajectory_id", "ascending"), ("seq", "ascending")],
    )
    among = many_files.read("events", columns, "run_id = ?", [RUN], among=("trajectory_id", chosen))
    unpruned = many_files.read(
        "events", columns, "run_id = ? and trajectory_id in (?, ?, ?)", [RUN, *chosen]
    )  # fmt: skip
    assert set(among.column("trajectory_id").to_pylist()) == set(chosen)
    assert among.sort_by(order).to_pylist() == unpruned.sort_by(order).to_pylist()
    assert opened[0] == many_files.files_within("events", "trajectory_id", min(chosen), max(chosen))
    assert len(opened[0]) < len(many_files.files("events"))
    assert many_files.read("events", columns, among=("trajectory_id", [])).num_rows == 0
    with pytest.raises(TypeError, match="positional"):
        many_files.read("events", columns, "run_id = $run", {"run": RUN}, among=("trajectory_id", chosen))
    with pytest.raises(TypeError, match="no `within`"):
        many_files.read("events", columns, within=("seq", 0, 1), among=("trajectory_id", chosen))


def test_a_query_within_a_run_reads_only_that_runs_files_and_gives_the_same_figures(many_files):
    per_run = "select count(*) as n, sum(n_turns) as turns from _t_trajectories where run_id = $run"
    everything = "select count(*) as n from _t_trajectories"
    for run in (RUN, "other"):
        within = ("run_id", run, run)
        assert many_files.sql(per_run, {"run": run}, within) == many_files.sql(per_run, {"run": run})
        # the files of the other run are not even opened: an unfiltered count sees this run's rows alone
        alone = many_files.sql(per_run, {"run": run}).column("n")[0].as_py()
        assert many_files.sql(everything, within=within).column("n")[0].as_py() == alone
    assert many_files.sql(everything).column("n")[0].as_py() == 6 * COMMITS + 4


def test_every_dashboard_figure_of_a_run_is_the_same_read_within_the_run_or_not(many_files, monkeypatch):
    from trajlake.dashboards import metrics

    figures = {
        "overview": lambda: metrics.overview_by_version(many_files, RUN),
        "entropy": lambda: metrics.rollout_entropy(many_files, [RUN, "other"]),
        "behaviour": lambda: metrics.behaviour_by_version(many_files, RUN),
        "tools": lambda: metrics.tool_stats(many_files, RUN, (0, 3)),
        "failures": lambda: metrics.failures_by(many_files, RUN, "label"),
        "arrivals": lambda: metrics.buffer_composition(many_files, RUN, "length", "arrivals"),
        "latency": lambda: metrics.length_percentiles(many_files, RUN),
    }
    narrowed = {name: figure() for name, figure in figures.items()}
    unnarrowed_sql = Lake.sql
    monkeypatch.setattr(
        Lake, "sql", lambda self, query, params=None, within=None: unnarrowed_sql(self, query, params)
    )
    for name, figure in figures.items():
        assert same_figures(narrowed[name].to_pylist(), figure().to_pylist()), name


def same_figures(a: list[dict], b: list[dict]) -> bool:
    """Equal rows, floats to 1e-9 relative: DuckDB's parallel sums vary in the last bits."""

    def same(x: object, y: object) -> bool:
        return math.isclose(x, y, rel_tol=1e-9) if isinstance(x, float) and isinstance(y, float) else x == y

    return len(a) == len(b) and all(
        r.keys() == q.keys() and all(same(r[k], q[k]) for k in r) for r, q in zip(a, b, strict=True)
    )


def test_aggregates_per_file_in_one_read_equal_each_file_read_alone(many_files):
    """`read(by_file=True)`: the aggregates of every file at once, as reading each alone gives them
    (the sampler's per-file counts); a file without matching rows has none."""
    files = many_files.file_stats("trajectories")
    query = {
        "where": "run_id = ? and finished",
        "params": [RUN],
        "select": "count(*) as n, sum(n_turns) as turns",
    }
    per_file = many_files.read("trajectories", files=files, by_file=True, **query).to_pylist()
    alone = {
        uri: many_files.read("trajectories", files=files.slice(i, 1), **query).to_pylist()[0]
        for i, uri in enumerate(files.column("uri").to_pylist())
    }
    assert {row.pop("uri"): row for row in per_file} == {uri: row for uri, row in alone.items() if row["n"]}
    assert 0 < len(per_file) < files.num_rows  # the other run's file holds none of these rows
    none = many_files.read("trajectories", files=files.slice(0, 0), by_file=True, **query)
    assert (none.num_rows, none.column_names) == (0, ["uri", "n", "turns"])
    with pytest.raises(TypeError, match="aggregates"):
        many_files.read("trajectories", ["n_turns"], by_file=True)


class _ObjectStoreLake:
    """A lake's files read as an object store's are (a pyarrow dataset DuckDB pushes filters into),
    here from local files."""

    is_local = False

    def __init__(self, files: list[str]) -> None:
        self._files = files

    def files(self, name: str) -> list[str]:
        return self._files

    def filesystem(self):
        import pyarrow.fs as pafs

        return pafs.LocalFileSystem(), "/"


def test_reads_among_ids_on_an_object_store_take_files_whose_strings_are_views(tmp_path):
    """delta-rs MERGE writes a projection's revised rows with `string_view` strings; reading them
    beside `string` files by id must not fail on the two types."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trajlake.store.reads import read_files
    from trajlake.store.tables import SCHEMAS

    schema = SCHEMAS["trajectories"]
    paths = []
    for i, strings in enumerate((pa.string(), pa.string_view())):
        ids = [f"t-{i}-{j:02d}" for j in range(50)]  # distinct values: their statistics are compared
        table = pa.table({f.name: [None] * 50 for f in schema} | {"run_id": ["r"] * 50, "trajectory_id": ids},
                         schema=schema)  # fmt: skip
        as_stored = pa.schema([f.with_type(strings) if f.type == pa.string() else f for f in schema])
        pq.write_table(table.cast(as_stored), path := str(tmp_path / f"{i}.parquet"))
        paths.append(f"file://{path}")
    where = "run_id = ? and trajectory_id between ? and ? and trajectory_id in (?, ?)"
    rows = read_files(_ObjectStoreLake(paths), "trajectories", ["trajectory_id"], where,
                      ["r", "t-0-07", "t-1-07", "t-0-07", "t-1-07"])  # fmt: skip
    assert sorted(rows.column("trajectory_id").to_pylist()) == ["t-0-07", "t-1-07"]
