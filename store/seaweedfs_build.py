"""SeaweedFS's `weed` binary, built once from the Go module proxy and cached outside the checkout.

The module `github.com/seaweedfs/seaweedfs` cannot be `go install`ed (its go.mod has a `replace`
directive), so its source is downloaded alone, copied out of the read-only module cache, and
built there as the main module: `go build` fetches only what it links (about 475 MB; a bare
`go mod download` in the source tree would fetch the whole graph, 3.4 GB).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

from trajlake.common.once import first_to_build
from trajlake.common.settings import cache_dir as cache_root
from trajlake.schemas.errors import TrajlakeError

log = logging.getLogger(__name__)

SEAWEEDFS_MODULE = "github.com/seaweedfs/seaweedfs"
SEAWEEDFS_VERSION = "v0.0.0-20261109003541-7506e5f91cd6"
"""The pseudo-version the Go module proxy serves (`weed version`: 30GB 4.53)."""


class S3ServerError(TrajlakeError, RuntimeError):
    """The local S3 server could not be built, started or stopped; the message says why and what to do."""


def weed_path(version: str = SEAWEEDFS_VERSION) -> Path:
    """Where the `weed` binary of `version` is cached (env TRAJLAKE_CACHE_DIR overrides ~/.cache/trajlake)."""
    return cache_root() / "seaweedfs" / version / "weed"


def ensure_weed(version: str = SEAWEEDFS_VERSION) -> Path:
    """Build `weed` of `version` once (several processes may ask at once); return its path."""
    binary = weed_path(version)
    home = binary.parent
    with first_to_build(binary, home / ".lock") as build:
        if not build:
            return binary
        go = shutil.which("go")
        if go is None:
            raise S3ServerError(
                "Go is not on PATH: building SeaweedFS needs Go 1.21 or newer (it fetches the toolchain "
                "SeaweedFS asks for); install it from https://go.dev/dl, or point AWS_ENDPOINT_URL at "
                "an S3 server that is already running"
            )
        started = time.monotonic()
        log.info("building SeaweedFS %s with Go into %s (the first time: about 5 minutes on 2 cores)",
                 version, home)  # fmt: skip
        # one source path (under the lock) for every build: Go's build cache is keyed on it
        source, partial = home / "src", home / f"weed.{os.getpid()}.partial"
        try:
            _copy_tree(_download(go, version, home), source)
            fix = "the build needs about 2.5 GB of memory and 2 GB of disk for Go's caches; run it again"
            _go(go, ["build", "-ldflags=-s -w", "-o", str(partial), "./weed"], source, fix)
            os.replace(partial, binary)  # a build cut short never looks finished
        finally:
            shutil.rmtree(source, ignore_errors=True)
            partial.unlink(missing_ok=True)
        log.info("built %s in %.0f s", binary, time.monotonic() - started)
    return binary


def _download(go: str, version: str, home: Path) -> Path:
    """Download the module's source alone into the Go module cache; return its directory there."""
    proxy = os.environ.get("GOPROXY", "https://proxy.golang.org")
    fix = f"check that this machine reaches the Go module proxy ({proxy})"
    out = _go(go, ["mod", "download", "-json", f"{SEAWEEDFS_MODULE}@{version}"], home, fix)
    return Path(json.loads(out)["Dir"])


def _copy_tree(module_dir: Path, source: Path) -> None:
    """Copy the read-only module source where `go build` may treat it as the main module."""
    shutil.rmtree(source, ignore_errors=True)
    shutil.copytree(module_dir, source)
    for path in (source, *source.rglob("*")):
        path.chmod(path.stat().st_mode | stat.S_IWUSR)


def _go(go: str, args: list[str], cwd: Path, fix: str) -> str:
    """Run `go args` in `cwd`; return its stdout, or raise `S3ServerError` with the end of its output."""
    proc = subprocess.run([go, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        output = (proc.stderr or proc.stdout).strip()[-2000:]
        raise S3ServerError(
            f"building SeaweedFS {SEAWEEDFS_VERSION} failed (`go {' '.join(args)}` exited {proc.returncode}): "
            f"{output}; {fix}"
        )
    return proc.stdout
