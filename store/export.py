"""`trajlake export`: the trajectories a SQL query selects, with their tokens, as files for SFT.

The query names trajectories (a `trajectory_id` column, and `run_id` where ids repeat across
runs). Each row is written with the columns the query returned, plus each trajectory's
`token_ids`, `logprobs` and `loss_mask` (from `events`, as the `trajectories` view assembles
them) and, where the run's tokenizer is on this machine, `messages`: every turn as chat text.
DuckDB streams the result in record batches into Parquet or JSON Lines files, so memory stays
bounded by one batch whatever the selection's size.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import pyarrow as pa

from trajlake.store.errors import LakeError
from trajlake.store.export_formats import MESSAGE_TYPE, ShardWriter, chat_messages, earlier_exports
from trajlake.store.sql import check_read_only
from trajlake.store.tokenizer import Decoder, TokenizerNotFound, find_decoder

if TYPE_CHECKING:
    from trajlake.store.config import ExportSettings
    from trajlake.store.lake import Lake

TOKEN_COLUMNS = ("token_ids", "logprobs", "loss_mask")
HIDDEN = "__trajlake_"
"""Prefix of the columns the export reads for itself (model, turn lengths) and does not write."""

TURN_LENGTHS_SQL = """
select run_id, trajectory_id,
  list(coalesce(len(input_token_ids), 0) order by seq) as input_lengths,
  list(len(output_token_ids) order by seq) as output_lengths
from (
  select run_id, trajectory_id, seq, input_token_ids, output_token_ids,
    max(case when input_is_full then seq end) over (partition by run_id, trajectory_id) as restart_seq
  from _t_events where event_type = 'turn'
)
where restart_seq is null or seq >= restart_seq
group by run_id, trajectory_id
"""
"""Per trajectory, the input and output length of each turn in `token_ids` (same restart rule
as `TRAJECTORY_TOKENS_SQL`), to cut the sequence into messages."""


class ExportError(LakeError):
    """An export that cannot run as asked; the message says what to change."""


@dataclass
class ExportReport:
    """What an export wrote."""

    out: Path
    rows: int = 0
    files: list[Path] = field(default_factory=list)
    text: bool = False
    columns: list[str] = field(default_factory=list)


def export(lake: Lake, settings: ExportSettings, stream: TextIO | None = None) -> ExportReport:
    """Write the trajectories `settings.sql` selects under `settings.out`; progress goes to `stream`."""
    from trajlake.common.terminal import Progress

    stream = stream or sys.stderr
    query = _statement(settings.sql)
    cur = lake.connect()
    try:
        columns = cur.sql(query).columns
        keys = selection_keys(cur, query, columns)
        query = by_labels(cur, query, keys, settings.with_labels, settings.without_labels)
        total = cur.sql(f"select count(*) from ({query}\n)").fetchall()[0][0]
        decoders = tokenizers(cur, query, keys, settings.tokenizer, stream)
        out = prepare_out(Path(settings.out), settings.force)
        select = export_query(query, columns, keys, text=bool(decoders))
        reader = cur.sql(select).to_arrow_reader(settings.batch_rows)
        report = ExportReport(out, text=bool(decoders))
        writer = ShardWriter(out, settings.format, settings.rows_per_file)
        schema = None
        try:
            with Progress(total, "export", unit="trajectories", stream=stream) as progress:
                for batch in reader:
                    batch = finish_batch(batch, decoders)
                    schema = batch.schema
                    writer.write(batch)
                    progress.update(batch.num_rows)
            writer.close(schema or finish_batch(_empty(reader.schema), decoders).schema)
        except BaseException:
            writer.abort()
            raise
    finally:
        cur.close()
    report.rows, report.files = writer.rows, writer.files
    report.columns = list(schema.names) if schema is not None else []
    return report


def _statement(sql: str) -> str:
    """The one read-only statement, ready to nest as a subquery."""
    check_read_only(sql)
    return sql.strip().rstrip(";").rstrip()


def prepare_out(out: Path, force: bool) -> Path:
    """The output directory, created; a non-empty one only with `force` (earlier exports removed)."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file; pass a directory")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise ExportError(
                f"--out {out} is not empty; pass --force to write into it, or pick another --out"
            )
        for path in earlier_exports(out):
            path.unlink()
        if (out / "data").is_dir() and not any((out / "data").iterdir()):
            shutil.rmtree(out / "data")
    out.mkdir(parents=True, exist_ok=True)
    return out


def selection_keys(cur: Any, query: str, columns: list[str]) -> list[str]:
    """The columns that name a trajectory in the query's result: run_id (if returned) and trajectory_id."""
    if "trajectory_id" not in columns:
        raise ExportError(
            f"the query returns no trajectory_id column (it returns {', '.join(columns)}); select it, "
            "e.g. select run_id, trajectory_id, reward from trajectories where …"
        )
    if "run_id" in columns:
        return ["run_id", "trajectory_id"]
    clash = cur.sql(
        f"select q.trajectory_id, list(distinct t.run_id order by t.run_id) from ({query}\n) q "
        "join _t_trajectories t on t.trajectory_id = q.trajectory_id "
        "group by q.trajectory_id having count(distinct t.run_id) > 1 limit 1"
    ).fetchall()
    if clash:
        raise ExportError(
            f"trajectory_id {clash[0][0]} is in several runs ({', '.join(clash[0][1])}); "
            "add run_id to the query's columns so each row names one trajectory"
        )
    return ["trajectory_id"]


def by_labels(
    cur: Any, query: str, keys: list[str], with_labels: list[str], without_labels: list[str]
) -> str:
    """`query` keeping only the trajectories that carry a label of `with_labels` and none of `without_labels`
    (specs `KEY` or `KEY=VALUE`, `store.labels.parse_specs`); the specs reach SQL as a registered table."""
    from trajlake.store.labels import LabelError, parse_specs

    try:
        wanted, unwanted = parse_specs(with_labels), parse_specs(without_labels)
    except LabelError as err:
        raise ExportError(str(err)) from None
    conditions = []
    for name, specs, negate in (("with", wanted, ""), ("without", unwanted, "not ")):
        if specs:
            table = f"{HIDDEN}labels_{name}"
            cur.register(table, pa.table({"key": [k for k, _ in specs], "value": [v for _, v in specs]},
                                         schema=pa.schema([("key", pa.string()), ("value", pa.string())])))  # fmt: skip
            conditions.append(
                f"{negate}exists (select 1 from current_labels l join {table} s on l.key = s.key "
                f"and (s.value is null or s.value = l.value) where {_on('l', keys)})"
            )
    if not conditions:
        return query
    return f"select q.* from ({query}\n) q where " + " and ".join(conditions)


def _on(alias: str, keys: list[str]) -> str:
    return " and ".join(f"{alias}.{k} = q.{k}" for k in keys)


def export_query(query: str, columns: list[str], keys: list[str], text: bool) -> str:
    """The query's rows with the token columns it lacks, and (for text) each row's model and turn lengths."""
    extra = [f"k.{c}" for c in TOKEN_COLUMNS if c not in columns]
    joins = []
    if extra:
        joins.append(f"left join _trajectory_tokens k on {_on('k', keys)}")
    if text:
        extra += [f"m.model as {HIDDEN}model", f"s.input_lengths as {HIDDEN}inputs"]
        extra += [f"s.output_lengths as {HIDDEN}outputs"]
        joins.append(f"left join _t_trajectories m on {_on('m', keys)}")
        joins.append(f"left join ({TURN_LENGTHS_SQL}) s on {_on('s', keys)}")
    return f"select q.*{''.join(', ' + e for e in extra)} from ({query}\n) q " + " ".join(joins)


def tokenizers(
    cur: Any, query: str, keys: list[str], override: str | None, stream: TextIO
) -> dict[Any, Decoder]:
    """A decoder per model the selection names, from `override` or the model each run recorded.

    An override that does not load is an error; a recorded model with no tokenizer on this
    machine only means no text, said once on `stream`."""
    if override:
        try:
            return {None: find_decoder(None, override)}
        except TokenizerNotFound as err:
            raise ExportError(str(err)) from None
    rows = cur.sql(
        f"select distinct m.model from ({query}\n) q join _t_trajectories m on {_on('m', keys)}"
    ).fetchall()
    decoders: dict[Any, Decoder] = {}
    missing = []
    for (model,) in rows:
        try:
            decoders[model] = find_decoder(model)
        except TokenizerNotFound:
            missing.append(str(model))
    if missing:
        text = "these trajectories get token ids only" if decoders else "writing token ids only, no messages"
        print(
            f"export: no local tokenizer for model {', '.join(sorted(missing))}; {text} "
            "(pass --tokenizer DIR for text)",
            file=stream,
        )
    return decoders


def _empty(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)


def finish_batch(batch: pa.RecordBatch, decoders: dict[Any, Decoder]) -> pa.RecordBatch:
    """Add `messages` (when a tokenizer is known) and drop the export's own columns."""
    if decoders:
        models = batch.column(f"{HIDDEN}model").to_pylist()
        ids = batch.column("token_ids").to_pylist()
        inputs = batch.column(f"{HIDDEN}inputs").to_pylist()
        outputs = batch.column(f"{HIDDEN}outputs").to_pylist()
        messages = []
        for model, seq, n_in, n_out in zip(models, ids, inputs, outputs, strict=True):
            decode = decoders.get(None) or decoders.get(model)
            usable = decode is not None and seq is not None and n_in is not None
            messages.append(chat_messages(seq, n_in, n_out, decode) if usable else None)  # type: ignore[arg-type]
        batch = batch.append_column("messages", pa.array(messages, MESSAGE_TYPE))
    keep = [i for i, name in enumerate(batch.schema.names) if not name.startswith(HIDDEN)]
    return batch.select(keep)
