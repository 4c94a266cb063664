"""Building SeaweedFS once: only the module's own source is downloaded, a failed build is never taken
as done, and a built binary is reused (a stand-in `go` records what it was asked to do)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trajlake.store.seaweedfs_build import (
    SEAWEEDFS_MODULE,
    SEAWEEDFS_VERSION,
    S3ServerError,
    ensure_weed,
    weed_path,
)

FAKE_GO = """#!/bin/sh
echo "$PWD $*" >> "$GO_CALLS"
if [ "$1 $2" = "mod download" ]; then
  mkdir -p "$MODULE_DIR/weed" && chmod -R a-w "$MODULE_DIR"   # the module cache is read-only
  echo "{\\"Dir\\": \\"$MODULE_DIR\\"}"
elif [ "$1" = build ]; then
  touch probe-writable || exit 3               # go build writes into the main module's tree
  printf 'half a binary' > "$4"
  [ -e "$FAIL_BUILD" ] && { echo "compile: out of memory" >&2; exit 1; }
  printf '#!/bin/sh\\necho weed\\n' > "$4" && chmod +x "$4"
fi
"""


@pytest.fixture
def fake_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `go` on PATH that records each call (cwd and arguments) in the returned file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "go").write_text(FAKE_GO)
    (bin_dir / "go").chmod(0o755)
    calls = tmp_path / "go-calls"
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("GO_CALLS", str(calls))
    monkeypatch.setenv("MODULE_DIR", str(tmp_path / "modcache" / "seaweedfs"))
    monkeypatch.setenv("FAIL_BUILD", str(tmp_path / "fail"))
    monkeypatch.setenv("TRAJLAKE_CACHE_DIR", str(tmp_path / "cache"))
    return calls


def test_a_failed_build_leaves_nothing_that_looks_built_and_the_next_one_builds_once(
    fake_go: Path, tmp_path: Path
) -> None:
    (tmp_path / "fail").touch()
    with pytest.raises(
        S3ServerError, match=r"building SeaweedFS .* failed \(`go build .*out of memory.*2.5 GB of memory"
    ):
        ensure_weed()
    assert not weed_path().exists()
    assert sorted(p.name for p in weed_path().parent.iterdir()) == [".lock"]  # no source, no partial binary

    (tmp_path / "fail").unlink()
    binary = ensure_weed()
    assert binary == tmp_path / "cache" / "seaweedfs" / SEAWEEDFS_VERSION / "weed"
    assert os.access(binary, os.X_OK) and b"echo weed" in binary.read_bytes()
    calls = fake_go.read_text().splitlines()
    downloads = [c for c in calls if " mod download" in c]
    assert all(c.endswith(f"mod download -json {SEAWEEDFS_MODULE}@{SEAWEEDFS_VERSION}") for c in downloads)
    builds = [c for c in calls if " build " in c]
    assert len(builds) == 2 and all(str(tmp_path / "modcache") not in c.split()[0] for c in builds)

    assert ensure_weed() == binary
    assert fake_go.read_text().splitlines() == calls  # cached: Go is not asked again


def test_without_go_the_error_says_where_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("TRAJLAKE_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(S3ServerError, match=r"Go is not on PATH.*https://go.dev/dl.*AWS_ENDPOINT_URL"):
        ensure_weed()
