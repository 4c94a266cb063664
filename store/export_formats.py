"""What `trajlake export` writes: numbered files per format, and each turn's tokens as chat text.

Files are written under a hidden temporary name and renamed into place once complete, so a
reader (or `datasets.load_dataset`) never sees half a file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from trajlake.common.terminal import json_default
from trajlake.store.tokenizer import Decoder

MESSAGE_TYPE = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
"""`messages`: the chat as text, one entry per prompt, tool output or model output."""

DATA_FILES = {
    "parquet": "part-{:05d}.parquet",
    "jsonl": "part-{:05d}.jsonl",
    "hf": "data/train-{:05d}.parquet",
}
"""Output file names per format; `--force` removes files of these shapes and nothing else."""

DATASET_CARD = """---
tags:
- trajlake
---
# Trajectories exported by trajlake export

Load with `datasets.load_dataset("{out}", split="train")`. `token_ids`, `logprobs` and
`loss_mask` are the whole token sequence of each trajectory (loss_mask true on trained model
tokens); `messages`, where a tokenizer was found, is the same sequence as chat messages
(role and content, without the chat template's markup).
"""
"""The `hf` format's README.md. No `configs:` block: `datasets` names its cache after a `configs:`
block's file patterns, never the files, so a later export under the same directory name would load
the earlier one's cached rows; without it the cache key holds each file's path and mtime, and the
split comes from the file names (`data/train-*.parquet`)."""


def earlier_exports(out: Path) -> list[Path]:
    """Files a previous export wrote into `out` (what `--force` replaces)."""
    found = [p for pattern in DATA_FILES.values() for p in out.glob(pattern.replace("{:05d}", "*"))]
    card = out / "README.md"
    if card.is_file() and "trajlake export" in card.read_text(errors="replace")[:4096]:
        found.append(card)
    return found


class ShardWriter:
    """Appends record batches to numbered files of at most `rows_per_file` rows each."""

    def __init__(self, out: Path, fmt: str, rows_per_file: int) -> None:
        self.out, self.fmt, self.rows_per_file = out, fmt, rows_per_file
        self.files: list[Path] = []
        self.rows = 0
        self._sink: Any = None
        self._tmp: Path | None = None
        self._in_file = 0

    def write(self, batch: pa.RecordBatch) -> None:
        """Write `batch`, starting a new file whenever the current one is full."""
        start = 0
        while start < batch.num_rows:
            if self._sink is None:
                self._open(batch.schema)
            n = min(batch.num_rows - start, self.rows_per_file - self._in_file)
            self._write(batch.slice(start, n))
            start += n
            self._in_file += n
            self.rows += n
            if self._in_file >= self.rows_per_file:
                self._close_file()

    def close(self, schema: pa.Schema | None = None) -> None:
        """Finish the last file (an empty result still gets one, with `schema`); write the dataset card."""
        if self._sink is None and not self.files and schema is not None:
            self._open(schema)
        self._close_file()
        if self.fmt == "hf":
            (self.out / "README.md").write_text(DATASET_CARD.format(out=self.out))

    def _open(self, schema: pa.Schema) -> None:
        path = self.out / DATA_FILES[self.fmt].format(len(self.files))
        path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = path.with_name(f".{path.name}.tmp")
        self.files.append(path)
        self._in_file = 0
        if self.fmt == "jsonl":
            self._sink = open(self._tmp, "w", encoding="utf-8")  # noqa: SIM115 - closed in _close_file
        else:
            self._sink = pq.ParquetWriter(self._tmp, schema, compression="zstd", compression_level=1)

    def _write(self, batch: pa.RecordBatch) -> None:
        if self.fmt == "jsonl":
            self._sink.write(
                "".join(json.dumps(row, default=json_default) + "\n" for row in batch.to_pylist())
            )
        else:
            self._sink.write_batch(batch)

    def _close_file(self) -> None:
        if self._sink is None:
            return
        self._sink.close()
        assert self._tmp is not None
        os.replace(self._tmp, self.files[-1])
        self._sink = self._tmp = None

    def abort(self) -> None:
        """Drop the file being written (an error or an interrupt midway)."""
        if self._sink is not None:
            self._sink.close()
            assert self._tmp is not None
            self._tmp.unlink(missing_ok=True)
            self._sink = self._tmp = None
            self.files.pop()


def chat_messages(
    token_ids: Sequence[int], input_lengths: Sequence[int], output_lengths: Sequence[int], decoder: Decoder
) -> list[dict[str, str]]:
    """One trajectory's tokens as chat messages: per turn, what came in (the prompt's system and user
    messages, later tool outputs) and what the model wrote (`assistant`), without template markup.

    Input the chat template does not mark up keeps the roles by position: the first prompt is
    `user`, later environment input `tool`."""
    messages = []
    at = 0
    for turn, (n_in, n_out) in enumerate(zip(input_lengths, output_lengths, strict=True)):
        if n_in:
            messages += decoder.messages(token_ids[at : at + n_in], "tool" if turn else "user")
        at += n_in
        messages.append({"role": "assistant", "content": decoder.reply(token_ids[at : at + n_out])})
        at += n_out
    return messages
