"""Alembic environment of the trajlake catalog.

`trajlake.store.catalog.upgrade` runs migrations programmatically and hands over an open
connection in `config.attributes["connection"]`; without one (the `alembic` CLI), the URL
comes from `sqlalchemy.url` in the config or the TRAJLAKE_CATALOG_URL env var.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from trajlake.store.catalog import Base
from trajlake.store.config import CatalogSettings

target_metadata = Base.metadata


def _env_url() -> str:
    url = CatalogSettings.from_env().catalog_url
    if not url:
        raise SystemExit("set sqlalchemy.url in the alembic config, or TRAJLAKE_CATALOG_URL")
    return url


def run_migrations_offline() -> None:
    """Emit SQL for a URL without connecting."""
    url = context.config.get_main_option("sqlalchemy.url") or _env_url()
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Migrate over the connection the catalog handed us (or one made from the URL)."""
    connection = context.config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = context.config.get_main_option("sqlalchemy.url") or _env_url()
    engine = create_engine(url)
    with engine.begin() as conn:
        context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
