"""Artifacts: the files an episode left (a verifier's output, the agent's logs), kept in the lake by content.

An importer or a harness records a manifest on `trajectory_finished.artifacts`: per file its `name`
(its path in the episode's directory), `bytes`, `sha256`, `source` (where it was) and, for a file of
at most `MAX_STORED_BYTES`, `path`: its copy under the lake root (`artifacts/<sha256[:2]>/<sha256>`,
written once whoever stores the same bytes). A re-score reads the copy, so it does not depend on the
episode's directory still being there; a larger file is read from its source.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trajlake.store.errors import LakeError

if TYPE_CHECKING:
    from trajlake.store.lake import Lake

MAX_STORED_BYTES = 1 << 20
"""Files up to this size are copied into the lake; larger ones are listed with their source only."""


def manifest_entry(lake: Lake, name: str, source: Path) -> dict[str, Any]:
    """The manifest entry of file `source` (named `name`), its bytes copied into the lake when small enough."""
    data = source.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    entry: dict[str, Any] = {
        "name": name,
        "bytes": len(data),
        "sha256": digest,
        "source": source.resolve().as_uri(),
    }
    if len(data) <= MAX_STORED_BYTES:
        entry["path"] = _store(lake, digest, data)
    return entry


def manifest(lake: Lake, root: Path, max_files: int = 200) -> list[dict[str, Any]]:
    """Entries for every file under directory `root` (at most `max_files`, by path), named by their path in it."""
    files = sorted(p for p in root.rglob("*") if p.is_file())[:max_files]
    return [manifest_entry(lake, p.relative_to(root).as_posix(), p) for p in files]


def _store(lake: Lake, digest: str, data: bytes) -> str:
    """Write `data` under the lake root by its digest (unless it is there); return its path in the lake."""
    relative = f"artifacts/{digest[:2]}/{digest}"
    fs, root = lake.filesystem()
    target = f"{root}/{relative}"
    if fs.get_file_info(target).type.name == "NotFound":
        fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
        with fs.open_output_stream(f"{target}.{digest[:8]}.tmp") as out:  # renamed when whole
            out.write(data)
        fs.move(f"{target}.{digest[:8]}.tmp", target)
    return relative


def read_artifact(lake: Lake | None, entry: dict[str, Any]) -> bytes:
    """The bytes of a manifest entry: its copy in the lake, else its source file."""
    if entry.get("path") and lake is not None:
        fs, root = lake.filesystem()
        with fs.open_input_stream(f"{root}/{entry['path']}") as f:
            return bytes(f.read())
    source = str(entry.get("source") or "")
    path = Path(source.removeprefix("file://"))
    if not path.is_file():
        raise LakeError(
            f"artifact {entry.get('name')!r} was not copied into the lake ({entry.get('bytes')} bytes) and its "
            f"source {source or '(none)'} is gone; restore the episode's directory to re-score with it"
        )
    return path.read_bytes()
