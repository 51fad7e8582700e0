"""Benchmark fleets built once: a database filled through the services is kept
as a PostgreSQL template, named by what built it and the migrations it has, and
each run starts from a clone of it (seconds, where building 1,000 racks with
their jobs takes minutes)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ADMIN = "postgres://postgres@127.0.0.1:5432/postgres"


def template_name(what: str) -> str:
    migrations = sorted(p.name for p in (ROOT / "fleet" / "migrations").glob("0*.py"))
    digest = hashlib.sha256(" ".join([what, *migrations]).encode()).hexdigest()[:10]
    return f"rackwise_tpl_{digest}"


def fresh_database(db: str, what: str, build: Callable[[], None]) -> bool:
    """Make ``db`` a clone of the template for ``what``; without one, create it
    empty, run ``build()`` on it (migrate and fill) and keep it as the template.
    Returns whether it was cloned."""
    import psycopg

    template = template_name(what)
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        have = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (template,)).fetchone()
        conn.execute(f"CREATE DATABASE {db}" + (f" TEMPLATE {template}" if have else ""))
    if not have:
        build()
    # Planner statistics: a database just filled has none until autovacuum comes
    # by, and without them PostgreSQL plans for a handful of racks (a seq scan of
    # every GPU where an index would do: 8-15 ms a query at 1,000 racks, growing
    # with the fleet, where a deployed database takes 1 ms).
    with psycopg.connect(ADMIN.rsplit("/", 1)[0] + f"/{db}", autocommit=True) as conn:
        conn.execute("ANALYZE")
    if not have:
        with psycopg.connect(ADMIN, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {template}")
            conn.execute(f"CREATE DATABASE {template} TEMPLATE {db}")
    return bool(have)
