"""Fleet-wide locks in Redis, shared by every worker on every host.

Decisions (scheduling passes, recovery and defrag planning) take one lock so
that no two of them decide on the same view of the fleet. Locks expire, so a
worker that dies holding one blocks the others only for the lock's lifetime."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis
from django.conf import settings
from redis.exceptions import LockError

DECISION_LOCK = "rackwise:lock:decisions"
SCHEDULE_DIRTY = "rackwise:schedule:dirty"


class Busy(Exception):
    """The lock is held by someone else."""


def client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=5, socket_timeout=10)


@contextmanager
def held(name: str, *, ttl: float, wait: float | None) -> Iterator[redis.lock.Lock]:
    """Hold lock ``name`` for at most ``ttl`` seconds; wait up to ``wait`` seconds
    for it (None: don't wait). Raises Busy when it cannot be had."""
    lock = client().lock(name, timeout=ttl, blocking=wait is not None, blocking_timeout=wait)
    if not lock.acquire():
        raise Busy(name)
    try:
        yield lock
    finally:
        try:
            lock.release()
        except LockError:
            pass  # expired meanwhile: someone else may hold it now, which is fine


def decisions(wait: float | None = 60.0):
    return held(DECISION_LOCK, ttl=120, wait=wait)


def action_lock(action_id: int):
    # Short-lived, and extended after every step: a killed worker's action is
    # picked up by reconcile once the lock lapses.
    return held(f"rackwise:lock:action:{action_id}", ttl=settings.RACKWISE_STALL_S, wait=None)


def is_held(name: str) -> bool:
    return bool(client().exists(name))
