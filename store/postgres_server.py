"""A local PostgreSQL server for the catalog in dev, tests and `trajlake stack`: `initdb` once, then
`pg_ctl start` on 127.0.0.1 and a free port, trust authentication for local clients; or, with
`password_auth`, passwords (SCRAM) over TCP and the superuser on the Unix socket alone (mode 0700:
this user and root), so that roles with passwords of their own (`trajlake stack`'s) mean something.

The server refuses to run as root; started by root it runs as the `postgres` user, which must be
able to reach the data directory. `start_postgres` returns the catalog URL once the server accepts
connections (`pg_ctl -w`); `stop_postgres` stops it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from trajlake.schemas.errors import TrajlakeError

PG_BIN_ENV = "TRAJLAKE_PG_BIN"
PG_LOG = "server.log"


class PostgresError(TrajlakeError, RuntimeError):
    """A local PostgreSQL server could not be set up, started or stopped."""


def pg_bin() -> Path:
    """The directory of `initdb` and `pg_ctl`: TRAJLAKE_PG_BIN, else the newest /usr/lib/postgresql/*/bin."""
    if env := os.environ.get(PG_BIN_ENV):
        return Path(env)
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))
    if not found or not (found[-1] / "initdb").exists():
        raise PostgresError(
            f"no PostgreSQL binaries in /usr/lib/postgresql/*/bin; install the postgresql package or set {PG_BIN_ENV}"
        )
    return found[-1]


def _as_postgres(*args: str) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else list(args)


def start_postgres(base: Path, port: int, timeout_s: float = 60.0, password_auth: bool = False) -> str:
    """Start the server of `base` (its cluster in `base/data`, made on first start; socket and
    `server.log` in `base`) on 127.0.0.1:`port`; return its SQLAlchemy URL once it accepts
    connections: the superuser's over TCP, or with `password_auth` over the socket (`admin_url`)."""
    base = Path(base).resolve()
    base.mkdir(parents=True, exist_ok=True)
    data, log = base / "data", base / PG_LOG
    if os.geteuid() == 0:
        shutil.chown(base, "postgres", "postgres")
    auth = ["--auth-local=trust", "--auth-host=scram-sha-256"] if password_auth else ["-A", "trust"]
    if not (data / "PG_VERSION").exists():
        _run([str(pg_bin() / "initdb"), "-D", str(data), *auth, "-U", "postgres", "-E", "UTF8",
              "--no-sync"], base, "initdb")  # fmt: skip
    options = (
        f"-c listen_addresses=127.0.0.1 -p {port} -k {base} -c fsync=off -c synchronous_commit=off "
        "-c full_page_writes=off -c max_connections=200"
    )
    if password_auth:
        options += " -c unix_socket_permissions=0700"
    _run([str(pg_bin() / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(log), "-w", "-t",
          str(int(timeout_s)), "start"], base, "pg_ctl start")  # fmt: skip
    return (
        admin_url(base, port) if password_auth else f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    )


def admin_url(base: Path, port: int) -> str:
    """The superuser's URL over the Unix socket of the server of `base` (no password: the socket's
    mode lets only this user and root connect)."""
    return f"postgresql+psycopg://postgres@/postgres?host={Path(base).resolve()}&port={port}"


def _run(command: list[str], base: Path, what: str) -> None:
    proc = subprocess.run(_as_postgres(*command), capture_output=True, text=True)
    if proc.returncode != 0:
        log = base / PG_LOG
        tail = log.read_text()[-2000:] if log.exists() else ""
        hint = ""
        if os.geteuid() == 0 and "Permission denied" in proc.stderr + tail:
            hint = f"; the server runs as user postgres, which cannot reach {base}: use a directory it can"
        raise PostgresError(f"{what} failed (code {proc.returncode}){hint}: {proc.stderr.strip()}\n{tail}")


def running_pid(base: Path) -> int | None:
    """The postmaster's pid of the server of `base` if it runs (from `postmaster.pid`)."""
    try:
        pid = int((Path(base).resolve() / "data" / "postmaster.pid").read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None
    return pid


def stop_postgres(base: Path, mode: str = "fast") -> bool:
    """Stop the server of `base` (`pg_ctl stop -m mode`, waiting); return whether one was running."""
    if running_pid(base) is None:
        return False
    data = Path(base).resolve() / "data"
    _run(
        [str(pg_bin() / "pg_ctl"), "-D", str(data), "-m", mode, "-w", "stop"],
        Path(base).resolve(),
        "pg_ctl stop",
    )
    return True
