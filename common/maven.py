"""Jars from Maven Central, fetched once into a cache directory outside the checkout (Kafka's broker,
Spark's Delta Lake and S3A): one directory per jar set, complete before anything uses it."""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from trajlake.common.once import first_to_build
from trajlake.common.settings import cache_dir as cache_root

log = logging.getLogger(__name__)


def jar_set_dir(kind: str, name: str, pom: str) -> Path:
    """Where the jars of `pom` are cached (env TRAJLAKE_CACHE_DIR overrides ~/.cache/trajlake): a
    directory per jar set, so a changed set never mixes with a cached one that a process may be using."""
    return cache_root() / kind / f"{name}-{hashlib.sha256(pom.encode()).hexdigest()[:8]}"


def fetch_jars(
    home: Path,
    pom: str,
    expect: str,
    what: str,
    error: type[Exception],
    no_mvn: str,
    exclude: Sequence[str] = (),
) -> Path:
    """Fetch the runtime dependencies of `pom` into `home`/libs with Maven once (a lock keeps several
    processes from fetching at once); return the libs directory. `expect`: a glob a complete fetch
    holds; `exclude`: artifact ids to leave out. Failures raise `error`: `no_mvn` says what to do
    without Maven, else Maven's own words are given."""
    libs, done = home / "libs", home / ".complete"
    with first_to_build(done, home / ".lock") as build:
        if not build:
            return libs
        mvn = shutil.which("mvn")
        if mvn is None:
            raise error(f"Maven (`mvn`) is not on PATH; install it (apt-get install maven), or {no_mvn}")
        (home / "pom.xml").write_text(pom)
        cmd = [
            mvn,
            "-q",
            "-B",
            "dependency:copy-dependencies",
            "-DoutputDirectory=libs",
            "-DincludeScope=runtime",
        ]
        if exclude:
            cmd.append(f"-DexcludeArtifactIds={','.join(exclude)}")
        log.info("fetching %s from Maven Central into %s", what, home)
        proc = subprocess.run(cmd, cwd=home, capture_output=True, text=True, check=False)
        if proc.returncode != 0 or not any(libs.glob(expect)):
            raise error(
                f"fetching {what} with Maven failed (exit {proc.returncode}); check network access to "
                f"Maven Central: {(proc.stdout + proc.stderr)[-2000:]}"
            )
        done.write_text(what)
    return libs
