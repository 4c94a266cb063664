"""Search a run's turns: a token-id subsequence over the ids, or a regular expression over their decoded text.

The scan reads the run's `events` files (those whose Delta statistics may hold the run), a file per
thread and a row group at a time (Parquet decoding and numpy release the GIL), and only the turns'
token lists of the chosen side (`output`: what the
model wrote; `input`: what the prompt and the environment appended; `all`). Before it reads, `plan`
says how many tokens it will read and, from the rate this machine scanned at (`SCAN_RATE`), about
how long that takes; while it reads, a callback hears how far it got. A token search matches within
one turn's list; a regex runs over each turn's text, decoded with the run's tokenizer.

The result counts, per policy version, the turns read, the turns with a hit and the matches (how
often does the model write `import pdfplumber`, per version?), and lists the first `limit` turns hit.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from trajlake.store.errors import LakeError
from trajlake.store.files import cores
from trajlake.store.reads import files_within

if TYPE_CHECKING:
    from trajlake.store.lake import Lake
    from trajlake.store.tokenizer import Decoder

Scope = Literal["output", "input", "all"]
SIDES: dict[str, tuple[str, ...]] = {
    "output": ("output_token_ids",),
    "input": ("input_token_ids",),
    "all": ("input_token_ids", "output_token_ids"),
}
KEY_COLUMNS = ("run_id", "trajectory_id", "seq", "event_type", "turn_index", "policy_version")
SCAN_RATE = {"tokens": 70e6, "regex": 3e6}
"""Tokens a second a search reads, by kind: what `plan` estimates a search's time from before it starts.
The token rate is measured (bench/scale.py's search_tokens_per_s at 1B tokens on two cores: 69-75M
output tokens a second); the regex rate, which decodes every turn first, is an assumption."""
SNIPPET = 60


class SearchError(LakeError):
    """A search that cannot run as asked (bad pattern, nothing to search); the message says the fix."""


@dataclass(frozen=True)
class SearchQuery:
    """What to look for, where: exactly one of `regex` and `tokens`."""

    run_id: str
    regex: str | None = None
    tokens: tuple[int, ...] | None = None
    scope: Scope = "output"
    limit: int = 200
    tokenizer: str | None = None

    def __post_init__(self) -> None:
        if (self.regex is None) == (self.tokens is None):
            raise SearchError("search for --regex PATTERN or --tokens ID,ID,… (one of them)")
        if self.tokens is not None and not self.tokens:
            raise SearchError("--tokens needs at least one token id, e.g. --tokens 4,5")
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as err:
                raise SearchError(f"--regex {self.regex!r} is not a regular expression: {err}") from None

    @property
    def kind(self) -> str:
        return "regex" if self.regex is not None else "tokens"


@dataclass
class SearchPlan:
    """What a search will read: files, tokens, and about how long that takes here."""

    files: list[str]
    tokens: int
    estimate_s: float


@dataclass
class VersionCounts:
    """What a search found among one policy version's turns."""

    turns: int = 0
    turns_hit: int = 0
    matches: int = 0
    trajectories: set[str] = field(default_factory=set)


@dataclass
class SearchResult:
    """Turns hit (the first `limit`), counts per policy version, and what the search read."""

    query: SearchQuery
    hits: list[dict[str, Any]] = field(default_factory=list)
    by_version: dict[int | None, VersionCounts] = field(default_factory=dict)
    turns_hit: int = 0
    matches: int = 0
    trajectories_hit: int = 0
    tokens_read: int = 0
    turns_read: int = 0
    seconds: float = 0.0

    def versions_table(self) -> pa.Table:
        """Per policy version: turns read, turns hit, their share, matches and trajectories hit."""
        rows = [
            {"policy_version": v, "turns": c.turns, "turns_hit": c.turns_hit,
             "share_hit": c.turns_hit / c.turns if c.turns else None, "matches": c.matches,
             "trajectories_hit": len(c.trajectories)}
            for v, c in sorted(self.by_version.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))
        ]  # fmt: skip
        return pa.Table.from_pylist(rows) if rows else pa.table({"policy_version": pa.array([], pa.int64())})


def plan(lake: Lake, query: SearchQuery) -> SearchPlan:
    """The run's events files and the tokens of the chosen side, with the time a scan of them takes here."""
    files = (
        files_within(lake, "events", "run_id", query.run_id, query.run_id) if lake.exists("events") else []
    )
    sides = {"output": "assistant_tokens", "input": "total_tokens - assistant_tokens", "all": "total_tokens"}
    total = (
        lake.sql(
            f"select coalesce(sum({sides[query.scope]}), 0) as n from trajectories where run_id = $run",
            {"run": query.run_id},
        )
        .column("n")[0]
        .as_py()
    )
    if not files or not total:
        raise SearchError(f"run {query.run_id!r} has no turns to search; check --run")
    return SearchPlan(files, int(total), int(total) / SCAN_RATE[query.kind])


def search(
    lake: Lake,
    query: SearchQuery,
    the_plan: SearchPlan | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SearchResult:
    """Scan the run's turns for `query`; `progress(tokens read, tokens planned)` after each file."""
    the_plan = the_plan or plan(lake, query)
    match = _token_matcher(query.tokens) if query.tokens is not None else _regex_matcher(lake, query)
    result = SearchResult(query)
    started = time.perf_counter()
    seen: set[str] = set()
    with ThreadPoolExecutor(cores()) as pool:
        for part in pool.map(lambda path: _scan(lake, path, query, match), _paths(the_plan.files)):
            _add(result, part, seen)
            if progress is not None:
                progress(result.tokens_read, the_plan.tokens)
    result.trajectories_hit = len(seen)
    result.seconds = time.perf_counter() - started
    return result


def _paths(files: Sequence[str]) -> list[str]:
    """The files' paths in the lake's filesystem."""
    return [uri.split("://", 1)[1] if "://" in uri else uri for uri in files]


Matcher = Callable[[pa.Table, Sequence[str]], tuple[np.ndarray, list[Any]]]
"""Per turn of a row group: its matches and where the first one is (a token offset, or a text snippet)."""


def _scan(lake: Lake, path: str, query: SearchQuery, match: Matcher) -> dict[str, Any]:
    """One events file's turns of the run, a row group at a time: their keys, tokens read and matches."""
    fs, _ = lake.filesystem()
    parts = []
    with fs.open_input_file(path) as f:
        parquet = pq.ParquetFile(f)
        stored = set(parquet.schema_arrow.names)
        columns = [c for c in (*KEY_COLUMNS, *SIDES[query.scope]) if c in stored]
        for group in range(parquet.num_row_groups):
            rows = parquet.read_row_group(group, columns=columns)
            turns = pc.and_(
                pc.equal(rows.column("event_type"), "turn"), pc.equal(rows.column("run_id"), query.run_id)
            )
            rows = rows.filter(turns)
            if rows.num_rows:
                parts.append(_match_rows(rows, query, match))
    if not parts:
        return {"rows": _KEYS.empty_table(), "counts": np.zeros(0, np.int64), "firsts": [], "tokens": 0}
    return {"rows": pa.concat_tables(p["rows"] for p in parts), "counts": np.concatenate([p["counts"] for p in parts]),
            "firsts": [f for p in parts for f in p["firsts"]], "tokens": sum(p["tokens"] for p in parts)}  # fmt: skip


_KEYS = pa.schema([("trajectory_id", pa.string()), ("seq", pa.int64()), ("turn_index", pa.int32()),
                   ("policy_version", pa.int64())])  # fmt: skip


def _match_rows(rows: pa.Table, query: SearchQuery, match: Matcher) -> dict[str, Any]:
    sides = [c for c in SIDES[query.scope] if c in rows.column_names]
    counts, firsts = match(rows, sides)
    tokens = sum(int(pc.sum(pc.list_value_length(rows.column(c))).as_py() or 0) for c in sides)
    return {
        "rows": rows.select(_KEYS.names).cast(_KEYS),
        "counts": counts,
        "firsts": firsts,
        "tokens": tokens,
    }


def _add(result: SearchResult, part: dict[str, Any], seen: set[str]) -> None:
    rows, counts = part["rows"], part["counts"]
    result.tokens_read += part["tokens"]
    result.turns_read += rows.num_rows
    read = rows.group_by("policy_version").aggregate([([], "count_all")])
    for v, n in zip(
        read.column("policy_version").to_pylist(), read.column("count_all").to_pylist(), strict=True
    ):
        result.by_version.setdefault(v, VersionCounts()).turns += n
    hit = np.flatnonzero(counts)
    if not len(hit):
        return
    hits = rows.take(pa.array(hit)).append_column("matches", pa.array(counts[hit]))
    for r in hits.to_pylist():
        per = result.by_version[r["policy_version"]]
        per.turns_hit += 1
        per.matches += r["matches"]
        per.trajectories.add(r["trajectory_id"])
        seen.add(r["trajectory_id"])
        result.turns_hit += 1
        result.matches += r["matches"]
    room = max(result.query.limit - len(result.hits), 0)
    for i, r in zip(hit[:room].tolist(), hits.slice(0, max(room, 0)).to_pylist(), strict=True):
        result.hits.append({**r, "first": part["firsts"][i]})


def _flat(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """A list column's values and each row's start offset (rows + 1 of them), as numpy."""
    lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False)
    values = pc.list_flatten(column).to_numpy(zero_copy_only=False)
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return values, offsets


def _token_matcher(pattern: Sequence[int]) -> Matcher:
    """Counts of `pattern` as a contiguous run of ids within each turn's list(s)."""
    p = np.asarray(pattern, np.int64)

    def match(rows: pa.Table, sides: Sequence[str]) -> tuple[np.ndarray, list[Any]]:
        counts = np.zeros(rows.num_rows, np.int64)
        firsts: list[Any] = [None] * rows.num_rows
        for side in sides:
            values, offsets = _flat(rows.column(side))
            at = np.flatnonzero(values[: max(len(values) - len(p) + 1, 0)] == p[0])
            for j in range(1, len(p)):
                at = at[values[at + j] == p[j]]
            row = np.searchsorted(offsets, at, side="right") - 1
            inside = at + len(p) <= offsets[row + 1]  # a match may not run into the next turn
            at, row = at[inside], row[inside]
            counts += np.bincount(row, minlength=rows.num_rows)
            for r, a in zip(*np.unique(row, return_index=True), strict=True):
                firsts[r] = firsts[r] or f"{side.removesuffix('_token_ids')} token {int(at[a] - offsets[r])}"
        return counts, firsts

    return match


def _regex_matcher(lake: Lake, query: SearchQuery) -> Matcher:
    """Counts of the regex in each turn's decoded text (its own tokenizer's decode, in Rust where it can)."""
    pattern = re.compile(query.regex or "")
    decoder_of = _decoders(lake, query)

    def match(rows: pa.Table, sides: Sequence[str]) -> tuple[np.ndarray, list[Any]]:
        counts = np.zeros(rows.num_rows, np.int64)
        firsts: list[Any] = [None] * rows.num_rows
        for side in sides:
            texts = _decode(decoder_of, rows, side)
            for i, text in enumerate(texts):
                found = list(islice(pattern.finditer(text), 10_000))
                if found:
                    counts[i] += len(found)
                    start = max(found[0].start() - SNIPPET // 2, 0)
                    firsts[i] = firsts[i] or text[start : start + SNIPPET]
        return counts, firsts

    return match


def _decoders(lake: Lake, query: SearchQuery) -> Callable[[str], Decoder]:
    """The decoder of a trajectory of the run: its recorded model's, or the override for all."""
    from trajlake.store.tokenizer import find_decoder

    if query.tokenizer:
        one = find_decoder(None, query.tokenizer)
        return lambda _: one
    models = (
        lake.sql("select distinct model from trajectories where run_id = $run", {"run": query.run_id})
        .column("model")
        .to_pylist()
    )
    by_model = {m: find_decoder(m) for m in models}
    if len(by_model) == 1:
        only = next(iter(by_model.values()))
        return lambda _: only
    owner = lake.sql(
        "select trajectory_id, model from trajectories where run_id = $run", {"run": query.run_id}
    ).to_pylist()
    of = {r["trajectory_id"]: by_model[r["model"]] for r in owner}
    return lambda tid: of[tid]


def _decode(decoder_of: Callable[[str], Decoder], rows: pa.Table, side: str) -> list[str]:
    """Each row's `side` ids as text, a batch per tokenizer."""
    ids = rows.column(side).to_pylist()
    owners = [decoder_of(t) for t in rows.column("trajectory_id").to_pylist()]
    texts = [""] * len(ids)
    for decoder in {id(d): d for d in owners}.values():
        mine = [i for i, d in enumerate(owners) if d is decoder]
        for i, text in zip(mine, decoder.batch([ids[i] or [] for i in mine]), strict=True):
            texts[i] = text
    return texts
