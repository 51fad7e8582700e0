"""Django's PostgreSQL backend with a pool that survives a database restart.

psycopg_pool checks a connection before handing it out and, when the check
fails, tries the next idle one after a backoff that doubles each time (about
1, 2, 4, 8, 16 s). After a PostgreSQL restart or failover every idle
connection is dead at once, so a pool holding ten of them made the first
request wait past the pool's 30 s timeout and fail. Here one dead connection
is taken as news about all of them: the pool's idle connections are checked
together (the dead ones are replaced in the background), and the request gets
a fresh connection after one backoff step instead of five.

While the database is down, psycopg_pool retries a connection with the same
doubling backoff (1, 2, 4 ... 32 s and on): after a 40 s outage its next try
came some 20 s after the database was back, and every request waited for it.
Here a retry is at most ``MAX_RECONNECT_DELAY_S`` after the last, so the pool
reconnects within about that of the database's return.

Django passes psycopg_pool's own check to the pool it builds and offers no
setting to choose another, so this backend builds the pool itself, as
Django's does, with this check. ENGINE ``rackwise.db``; everything else is
Django's backend."""

from __future__ import annotations

import logging

from django.db.backends.postgresql import base
from psycopg_pool import ConnectionPool
from psycopg_pool.base import AttemptWithBackoff

log = logging.getLogger(__name__)


def check_connection(conn) -> None:
    """The pool's check: psycopg_pool's one round trip; on failure, every idle
    connection of the pool is checked at once before the error goes back to the
    pool (which discards this one and retries)."""
    try:
        ConnectionPool.check_connection(conn)
    except Exception:
        pool = getattr(conn, "_pool", None)  # getconn sets it before the check
        if isinstance(pool, ConnectionPool):
            log.warning("a pooled database connection was dead; checking every idle one")
            pool.check()  # uses ConnectionPool.check_connection: no recursion
        raise


MAX_RECONNECT_DELAY_S = 2.0


class _CappedBackoff(AttemptWithBackoff):
    """psycopg_pool's reconnection backoff, never more than MAX_RECONNECT_DELAY_S."""

    def update_delay(self, now: float) -> None:
        super().update_delay(now)
        self.delay = min(self.delay, MAX_RECONNECT_DELAY_S)


class Pool(ConnectionPool):
    """psycopg_pool's pool with :func:`check_connection` and a capped
    reconnection backoff (psycopg_pool 3.3's ``_add_connection`` takes the
    attempt to continue; a first attempt gets ours)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, check=check_connection, **kwargs)

    def _add_connection(self, attempt: AttemptWithBackoff | None, growing: bool = False) -> None:
        super()._add_connection(attempt or _CappedBackoff(timeout=self.reconnect_timeout), growing)


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def pool(self):
        pool_options = self.settings_dict["OPTIONS"].get("pool")
        if pool_options and self.alias != base.NO_DB_ALIAS and self.alias not in self._connection_pools:
            options = {} if pool_options is True else dict(pool_options)
            connect_kwargs = self.get_connection_params()
            connect_kwargs["autocommit"] = True  # as Django's: it sets the mode later
            # Built closed, like Django's; the first thread to store it wins.
            self._connection_pools.setdefault(
                self.alias,
                Pool(kwargs=connect_kwargs, open=False, configure=self._configure_connection, **options),
            )
        return super().pool
