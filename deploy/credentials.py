"""Credentials per role in `trajlake stack`: the catalog's PostgreSQL roles and each role's env file.

The stack's clients come in two roles (`ROLES`): a writer (sinks, projector, trainers, compaction)
and a reader (dashboard, SQL users). Each gets its own S3 identity (`store.s3_server.ROLE_ACTIONS`)
and its own PostgreSQL role: `trajlake_trainer` may read and change the catalog's rows (runs, policy
versions, leases, cursors, file counts) but not its schema; `trajlake_reader` may only SELECT. The
catalog is migrated by the superuser (over the server's Unix socket) before either connects. The
passwords reach the server as SCRAM verifiers computed here (libpq's `PQencryptPasswordConn`), so
no statement, and no server log line, ever holds one.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from pathlib import Path

from trajlake.deploy.config import READER, ROLES, WRITER

CATALOG_ROLES = {WRITER: "trajlake_trainer", READER: "trajlake_reader"}
"""The stack's role -> its PostgreSQL role."""
RIGHTS = {WRITER: "SELECT, INSERT, UPDATE, DELETE", READER: "SELECT"}
"""What each PostgreSQL role may do with the catalog's tables (`alembic_version`: SELECT for both)."""
ENV_DIR = "env"


def catalog_roles(admin_url: str, port: int, passwords: Mapping[str, str | None]) -> dict[str, str]:
    """Migrate the catalog as the superuser (`admin_url`), create or update each role with its
    password (`passwords[role]`, a new one where None) and its rights; return role -> its URL."""
    import psycopg
    from psycopg import sql
    from sqlalchemy.engine import make_url

    from trajlake.store.catalog import Base, Catalog

    Catalog(admin_url).close()  # the schema, as its owner: the roles get rights on its tables
    admin = make_url(admin_url)
    tables = sql.SQL(", ").join(sql.Identifier(t) for t in Base.metadata.tables)
    urls = {}
    with psycopg.connect(host=str(admin.query["host"]), port=port, user=admin.username, dbname=admin.database,
                         autocommit=True) as conn:  # fmt: skip
        for role in ROLES:
            name, password = CATALOG_ROLES[role], passwords.get(role) or secrets.token_urlsafe(24)
            verifier = conn.pgconn.encrypt_password(
                password.encode(), name.encode(), b"scram-sha-256"
            ).decode()
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [name]).fetchone()
            verb = sql.SQL("ALTER" if exists else "CREATE")
            conn.execute(
                sql.SQL("{} ROLE {} LOGIN PASSWORD {}").format(
                    verb, sql.Identifier(name), sql.Literal(verifier)
                )
            )
            grants = ["GRANT USAGE ON SCHEMA public TO {role}", "GRANT SELECT ON alembic_version TO {role}",
                      "GRANT " + RIGHTS[role] + " ON {tables} TO {role}"]  # fmt: skip
            if role == WRITER:  # the lease ids
                grants.append("GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}")
            for grant in grants:
                conn.execute(sql.SQL(grant).format(role=sql.Identifier(name), tables=tables))
            url = admin.set(username=name, password=password, host="127.0.0.1", port=port, query={})
            urls[role] = url.render_as_string(hide_password=False)
    return urls


def write_env_files(directory: Path, envs: Mapping[str, Mapping[str, str]]) -> dict[str, Path]:
    """Write each role's environment as NAME=value lines to `directory/env/<role>.env`, readable by
    this user alone; return role -> its file."""
    env_dir = directory / ENV_DIR
    env_dir.mkdir(mode=0o700, exist_ok=True)
    env_dir.chmod(0o700)
    files = {}
    for role, env in envs.items():
        path = env_dir / f"{role}.env"
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text("".join(f"{name}={value}\n" for name, value in env.items()))
        files[role] = path
    return files
