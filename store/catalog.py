"""The SQL catalog: runs, policy versions, sampler leases, import cursors and the sampler's file
counts (SQLite by default, PostgreSQL by URL).

Leases are what keep several trainer ranks, in separate processes, from taking the same
trajectory: a rank claims trajectory ids in one atomic statement,

    INSERT INTO sampler_leases ... ON CONFLICT (run_id, trajectory_id)
    DO UPDATE SET owner = excluded.owner, ...  WHERE NOT consumed AND expires_at < :now
    RETURNING trajectory_id

which inserts a free id, takes over an expired lease (a crashed rank's), and leaves a live
or consumed one alone; only the ids it returns belong to the caller. PostgreSQL locks the
conflicting row for the statement, so two ranks racing for an id cannot both get it; on
SQLite every write transaction starts with BEGIN IMMEDIATE (one writer at a time) and
waits on a busy timeout. The schema is created and upgraded by Alembic on open.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Integer,
    String,
    UniqueConstraint,
    create_engine,
    delete,
    event,
    func,
    select,
    update,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from trajlake.common.retry import retrying
from trajlake.schemas.errors import TrajlakeError

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
MIGRATION_LOCK_KEY = 7_305_221_001
CLAIM_CHUNK = 500
"""Ids (or paths, or rows) per statement: keeps bound parameters under SQLite's limit."""


def utcnow() -> dt.datetime:
    """Naive UTC now: the catalog stores naive UTC timestamps on every backend."""
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


class Base(DeclarativeBase):
    """Declarative base of the catalog's tables."""


class Run(Base):
    """A training run and its resolved config."""

    __tablename__ = "runs"
    run_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    config: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    status: Mapped[str] = mapped_column(String(40), default="running")


class PolicyVersion(Base):
    """A policy version a trainer published: its step and checkpoint."""

    __tablename__ = "policy_versions"
    run_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger)
    checkpoint: Mapped[str | None] = mapped_column(String(2000), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)


class SamplerLease(Base):
    """Who holds (or consumed) a trajectory: at most one row per (run, trajectory)."""

    __tablename__ = "sampler_leases"
    __table_args__ = (UniqueConstraint("run_id", "trajectory_id", name="uq_sampler_leases_run_trajectory"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(200), index=True)
    trajectory_id: Mapped[str] = mapped_column(String(200))
    owner: Mapped[str] = mapped_column(String(200))
    rank: Mapped[int] = mapped_column(Integer, default=0)
    trainer_version: Mapped[int] = mapped_column(BigInteger, default=0)
    step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    leased_at: Mapped[dt.datetime] = mapped_column(DateTime)
    expires_at: Mapped[dt.datetime] = mapped_column(DateTime)
    consumed: Mapped[bool] = mapped_column(Boolean, default=False)
    consumed_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)


class SourceCursor(Base):
    """How far a poller has imported an external log (e.g. Agent Lightning's terminal rollouts)."""

    __tablename__ = "source_cursors"
    run_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    source: Mapped[str] = mapped_column(String(500), primary_key=True)
    position: Mapped[int] = mapped_column(BigInteger)
    last_key: Mapped[str | None] = mapped_column(String(500), nullable=True)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)


class FileCount(Base):
    """A `trajectories` data file's rows of one run that a sampler counts without reading them:
    the finished ones, the system failures among them and the others without a reward. A data
    file never changes, so its count holds for as long as the file is part of the table; a new
    sampler reads it here instead of the file. The row of a file compaction replaced stays,
    unread (a row per file a sampler ever counted)."""

    __tablename__ = "trajectory_file_counts"
    run_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    path: Mapped[str] = mapped_column(String(500), primary_key=True)
    finished: Mapped[int] = mapped_column(BigInteger)
    system_failures: Mapped[int] = mapped_column(BigInteger)
    no_reward: Mapped[int] = mapped_column(BigInteger)


FILE_COUNTS = tuple(c.name for c in FileCount.__table__.columns if not c.primary_key)
"""The counts a `FileCount` keeps: `finished`, `system_failures`, `no_reward`."""


def default_url(lake_root: str | Path) -> str:
    """The embedded catalog of a lake: `sqlite:///<lake>/catalog.db`."""
    return f"sqlite:///{Path(lake_root).resolve() / 'catalog.db'}"


def _normalise_url(url: str) -> str:
    # psycopg 3 is the driver we ship; a bare postgresql:// URL would pick psycopg2.
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


class CatalogRefused(TrajlakeError, RuntimeError):
    """The catalog's database refused this role an operation (a reader taking a lease)."""


def _make_engine(url: str, busy_timeout_s: float) -> Engine:
    if not url.startswith("sqlite"):
        engine = create_engine(url, pool_pre_ping=True, future=True)
        event.listen(engine, "handle_error", _refused)
        return engine
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": busy_timeout_s}, future=True)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy, not pysqlite, issue BEGIN, so that we can make it IMMEDIATE.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        cur.execute("PRAGMA journal_mode = WAL")
        # WAL + NORMAL: a commit survives a crash of any process; only a power cut may lose
        # the last commits (a lease then simply comes back), and commits skip an fsync each.
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def _refused(context: Any) -> None:
    """Turn PostgreSQL's "permission denied" (SQLSTATE 42501) into a `CatalogRefused` naming the role."""
    if getattr(context.original_exception, "sqlstate", None) == "42501":
        user = context.engine.url.username
        what = str(context.original_exception).splitlines()[0]
        raise CatalogRefused(
            f"the catalog refused role {user!r}: {what}; that role may not change the catalog (a "
            "reader's reads only): taking leases and recording runs takes a role that may write (a "
            "`trajlake stack`'s trainer role: TRAJLAKE_CATALOG_URL in its env/writer.env)"
        )


def upgrade(engine: Engine) -> None:
    """Run Alembic migrations up to head on `engine`'s database."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            # Several ranks may open a fresh catalog at once; migrate one at a time.
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})")
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


class Catalog:
    """Runs, policy versions, sampler leases, import cursors and file counts in one SQL database."""

    def __init__(
        self,
        url: str = "sqlite:///trajlake-data/catalog.db",
        busy_timeout_s: float = 30.0,
        clock: Callable[[], dt.datetime] = utcnow,
    ) -> None:
        self.url = _normalise_url(url)
        self.clock = clock  # naive UTC now; tests pass their own to expire leases without sleeping
        self.engine = _make_engine(self.url, busy_timeout_s)
        upgrade(self.engine)

    @classmethod
    def for_lake(cls, lake_root: str | Path, url: str | None = None) -> Catalog:
        """The catalog at `url`, or the lake's embedded SQLite catalog."""
        return cls(url or default_url(lake_root))

    @property
    def dialect(self) -> str:
        """`sqlite` or `postgresql`."""
        return self.engine.dialect.name

    def close(self) -> None:
        """Close pooled connections."""
        self.engine.dispose()

    # -- runs ---------------------------------------------------------------------------
    def register_run(
        self, run_id: str, config: dict[str, Any] | None = None, status: str = "running"
    ) -> None:
        """Create the run, or update its config (when given) and status.

        One upsert: ranks that start a run together do not race to insert it (a read, then an
        insert, let two see no run and the second fail on the key)."""
        table: Any = Run.__table__
        stmt = self._insert()(table).values(
            run_id=run_id, config=config, status=status, created_at=self.clock()
        )
        changes = {"status": stmt.excluded.status} | (
            {"config": stmt.excluded.config} if config is not None else {}
        )
        with self.engine.begin() as conn:
            conn.execute(stmt.on_conflict_do_update(index_elements=[table.c.run_id], set_=changes))

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        """The run as a dict, or None."""
        with Session(self.engine) as session:
            run = session.get(Run, run_id)
            if run is None:
                return None
            return {
                "run_id": run.run_id,
                "created_at": run.created_at,
                "config": run.config,
                "status": run.status,
            }

    def set_run_status(self, run_id: str, status: str) -> None:
        """Mark a run (e.g. `finished`, `failed`)."""
        with Session(self.engine) as session, session.begin():
            session.execute(update(Run).where(Run.run_id == run_id).values(status=status))

    # -- policy versions ------------------------------------------------------------------
    def record_policy_version(
        self, run_id: str, version: int, step: int, checkpoint: str | None = None
    ) -> None:
        """Store (or overwrite) a published policy version."""
        with Session(self.engine) as session, session.begin():
            session.merge(
                PolicyVersion(
                    run_id=run_id, version=version, step=step, checkpoint=checkpoint, created_at=self.clock()
                )
            )

    def latest_policy_version(self, run_id: str) -> dict[str, Any] | None:
        """The highest published version of a run: version, step, checkpoint; None if none."""
        with Session(self.engine) as session:
            row = session.scalars(
                select(PolicyVersion)
                .where(PolicyVersion.run_id == run_id)
                .order_by(PolicyVersion.version.desc())
                .limit(1)
            ).first()
            if row is None:
                return None
            return {"version": row.version, "step": row.step, "checkpoint": row.checkpoint}

    # -- import cursors -------------------------------------------------------------------
    def source_cursor(self, run_id: str, source: str) -> tuple[int, str | None] | None:
        """(position, key of the last record taken) of `source` for `run_id`; None before the first save."""
        with Session(self.engine) as session:
            row = session.get(SourceCursor, (run_id, source))
            return None if row is None else (row.position, row.last_key)

    def save_source_cursor(self, run_id: str, source: str, position: int, last_key: str | None) -> None:
        """Store (or move) the cursor; call it only once what it covers is committed to the lake."""
        with Session(self.engine) as session, session.begin():
            session.merge(
                SourceCursor(
                    run_id=run_id,
                    source=source,
                    position=position,
                    last_key=last_key,
                    updated_at=self.clock(),
                )
            )

    # -- file counts ------------------------------------------------------------------------
    def file_counts(self, run_id: str, paths: Sequence[str]) -> dict[str, dict[str, int]]:
        """The stored `FileCount` of each of `paths` that has one: path -> `FILE_COUNTS`."""
        found: dict[str, dict[str, int]] = {}
        columns = [FileCount.path, *(getattr(FileCount, name) for name in FILE_COUNTS)]
        with self.engine.connect() as conn:
            for start in range(0, len(paths), CLAIM_CHUNK):
                chunk = paths[start : start + CLAIM_CHUNK]
                stmt = select(*columns).where(FileCount.run_id == run_id, FileCount.path.in_(chunk))
                for path, *values in conn.execute(stmt):
                    found[path] = dict(zip(FILE_COUNTS, values, strict=True))
        return found

    def save_file_counts(self, run_id: str, counts: Mapping[str, Mapping[str, int]]) -> None:
        """Store each file's `FILE_COUNTS` (path -> counts); a file already stored keeps its row,
        which holds the same counts (ranks counting one file at once do not conflict)."""
        rows = [
            {"run_id": run_id, "path": path, **{k: c[k] for k in FILE_COUNTS}} for path, c in counts.items()
        ]
        if not rows:
            return
        table: Any = FileCount.__table__
        stmt = self._insert()(table).on_conflict_do_nothing(index_elements=[table.c.run_id, table.c.path])
        with self.engine.begin() as conn:
            for start in range(0, len(rows), CLAIM_CHUNK):
                conn.execute(stmt, rows[start : start + CLAIM_CHUNK])

    # -- leases ---------------------------------------------------------------------------
    def claim(
        self,
        run_id: str,
        trajectory_ids: Sequence[str],
        owner: str,
        *,
        rank: int = 0,
        trainer_version: int = 0,
        ttl_s: float = 300.0,
    ) -> list[str]:
        """Lease the free or expired ids among `trajectory_ids`; return the ids now held by `owner`."""
        if not trajectory_ids:
            return []
        # Every claimer locks rows in the same (sorted) order, so concurrent claims of
        # overlapping ids queue behind each other instead of deadlocking.
        ids = sorted(set(trajectory_ids))
        # a lock conflict means the other transaction won: try again, a little later each time
        for attempt in retrying(
            retry_on=_is_lock_conflict, attempts=DEADLOCK_RETRIES, wait=lambda n: 0.01 * n
        ):
            with attempt:
                return self._claim_sorted(run_id, ids, owner, rank, trainer_version, ttl_s)
        raise AssertionError("unreachable")

    def _claim_sorted(
        self, run_id: str, ids: list[str], owner: str, rank: int, trainer_version: int, ttl_s: float
    ) -> list[str]:
        claimed: list[str] = []
        with self.engine.begin() as conn:
            now = self.clock()
            expires = now + dt.timedelta(seconds=ttl_s)
            for start in range(0, len(ids), CLAIM_CHUNK):
                chunk = ids[start : start + CLAIM_CHUNK]
                rows = [
                    {
                        "run_id": run_id,
                        "trajectory_id": tid,
                        "owner": owner,
                        "rank": rank,
                        "trainer_version": trainer_version,
                        "leased_at": now,
                        "expires_at": expires,
                        "consumed": False,
                    }
                    for tid in chunk
                ]
                claimed.extend(conn.execute(self._claim_statement(now), rows).scalars().all())
        return claimed

    def _insert(self) -> Any:
        """The dialect's `insert`, which has `on_conflict_do_update` (an upsert)."""
        from sqlalchemy.dialects import postgresql, sqlite

        return postgresql.insert if self.dialect == "postgresql" else sqlite.insert

    def _claim_statement(self, now: dt.datetime) -> Any:
        table: Any = SamplerLease.__table__
        stmt = self._insert()(table)
        excluded = stmt.excluded
        return stmt.on_conflict_do_update(
            index_elements=[table.c.run_id, table.c.trajectory_id],
            set_={
                "owner": excluded.owner,
                "rank": excluded.rank,
                "trainer_version": excluded.trainer_version,
                "leased_at": excluded.leased_at,
                "expires_at": excluded.expires_at,
                "step": None,
            },
            where=(table.c.consumed.is_(False)) & (table.c.expires_at < now),
        ).returning(table.c.trajectory_id)

    def renew(
        self, run_id: str, owner: str, ttl_s: float = 300.0, trajectory_ids: Iterable[str] | None = None
    ) -> int:
        """Push back the expiry of `owner`'s live leases (all, or the given ids); return how many."""
        with self.engine.begin() as conn:
            stmt = (
                update(SamplerLease)
                .where(
                    SamplerLease.run_id == run_id,
                    SamplerLease.owner == owner,
                    SamplerLease.consumed.is_(False),
                )
                .values(expires_at=self.clock() + dt.timedelta(seconds=ttl_s))
            )
            if trajectory_ids is not None:
                stmt = stmt.where(SamplerLease.trajectory_id.in_(list(trajectory_ids)))
            return conn.execute(stmt).rowcount

    def release(self, run_id: str, trajectory_ids: Iterable[str], owner: str) -> int:
        """Give back `owner`'s unconsumed leases on these ids; return how many."""
        ids = list(trajectory_ids)
        if not ids:
            return 0
        with self.engine.begin() as conn:
            stmt = delete(SamplerLease).where(
                SamplerLease.run_id == run_id,
                SamplerLease.owner == owner,
                SamplerLease.consumed.is_(False),
                SamplerLease.trajectory_id.in_(ids),
            )
            return conn.execute(stmt).rowcount

    def mark_consumed(
        self, run_id: str, trajectory_ids: Iterable[str], owner: str, step: int | None = None
    ) -> list[str]:
        """Mark `owner`'s leases consumed (used by a step); return the ids it still held.

        An id missing from the result had expired and been taken by another rank: the
        caller must not record it as its own.
        """
        ids = list(trajectory_ids)
        if not ids:
            return []
        with self.engine.begin() as conn:
            stmt = (
                update(SamplerLease)
                .where(
                    SamplerLease.run_id == run_id,
                    SamplerLease.owner == owner,
                    SamplerLease.consumed.is_(False),
                    SamplerLease.trajectory_id.in_(ids),
                )
                .values(consumed=True, consumed_at=self.clock(), step=step)
                .returning(SamplerLease.trajectory_id)
            )
            return list(conn.execute(stmt).scalars().all())

    def unavailable_ids(self, run_id: str) -> set[str]:
        """Ids another claim would not get now: consumed, or leased and not expired."""
        now = self.clock()
        with self.engine.connect() as conn:
            stmt = select(SamplerLease.trajectory_id).where(
                SamplerLease.run_id == run_id,
                (SamplerLease.consumed.is_(True)) | (SamplerLease.expires_at >= now),
            )
            return set(conn.execute(stmt).scalars().all())

    def lease_counts(self, run_id: str) -> dict[str, int]:
        """How many leases of a run are consumed, live (held) and expired."""
        now = self.clock()
        lease = SamplerLease
        with self.engine.connect() as conn:
            consumed, live, expired = conn.execute(
                select(
                    func.count().filter(lease.consumed.is_(True)),
                    func.count().filter(lease.consumed.is_(False), lease.expires_at >= now),
                    func.count().filter(lease.consumed.is_(False), lease.expires_at < now),
                ).where(lease.run_id == run_id)
            ).one()
        return {"consumed": consumed, "live": live, "expired": expired}

    def consumed_ids(self, run_id: str) -> list[str]:
        """Every consumed trajectory id of a run."""
        with self.engine.connect() as conn:
            stmt = select(SamplerLease.trajectory_id).where(
                SamplerLease.run_id == run_id, SamplerLease.consumed.is_(True)
            )
            return list(conn.execute(stmt).scalars().all())


DEADLOCK_RETRIES = 5


def _is_lock_conflict(err: BaseException) -> bool:
    """True for PostgreSQL deadlock / serialization failures (SQLSTATE 40P01, 40001): safe to retry."""
    if not isinstance(err, OperationalError):
        return False
    code = getattr(getattr(err, "orig", None), "sqlstate", None)
    return code in {"40P01", "40001"}
