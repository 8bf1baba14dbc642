"""A fresh PostgreSQL database for one run: what the benchmarks and tests on PostgreSQL write to."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import sqlalchemy as sa


@contextlib.contextmanager
def database(server_url: str, prefix: str = "agl_bench") -> Iterator[str]:
    """A new database on the PostgreSQL server `server_url` names (its URL), dropped afterwards
    with whatever is still connected to it."""
    admin_url = sa.make_url(server_url).set(drivername="postgresql+psycopg")
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield admin_url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()
