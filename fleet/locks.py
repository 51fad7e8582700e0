"""Fleet-wide locks in Redis, shared by every worker on every host.

Decisions (scheduling passes, recovery and defrag planning, proposal rechecks)
take one lock so that no two of them decide on the same view of the fleet.
Locks expire, so a worker that dies holding one blocks the others only for the
lock's lifetime.

The decision lock is short (``RACKWISE_DECISION_LOCK_TTL_S``, 15 s) and kept
alive by the pass that holds it, as a :class:`Lease`:

1. A renewer thread resets the TTL every third of it while the holder runs, so
   a pass longer than the TTL keeps the lock and no second pass starts. A
   process that is killed stops renewing with it: the lock is free again
   within one TTL.
2. Renewal can fail (Redis unreachable past the TTL, the key gone): the lock
   may then be someone else's. So the holder calls :meth:`Lease.checkpoint`
   inside each transaction that records decisions, just before it commits; a
   lost lease raises :class:`LockLost` there, the transaction rolls back, and
   the pass stops. A pass that lost its lock never commits alongside the next.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from django.conf import settings
from redis.exceptions import LockError, RedisError

log = logging.getLogger(__name__)

DECISION_LOCK = "rackwise:lock:decisions"
SCHEDULE_DIRTY = "rackwise:schedule:dirty"
SYNC_LOCK = "rackwise:lock:sync"
SYNC_DIRTY = "rackwise:sync:dirty"
SYNC_STARTED = "rackwise:sync:started"
# How many leases were lost, ever (the rackwise_decision_leases_lost_total metric).
LEASES_LOST = "rackwise:metrics:leases_lost"


class Busy(Exception):
    """The lock is held by someone else."""


class LockLost(Exception):
    """The lease lapsed or was taken over: stop before committing anything more."""


def client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=5, socket_timeout=10)


@contextmanager
def held(
    name: str, *, ttl: float, wait: float | None, thread_local: bool = True
) -> Iterator[redis.lock.Lock]:
    """Hold lock ``name`` for at most ``ttl`` seconds; wait up to ``wait`` seconds
    for it (None: don't wait). Raises Busy when it cannot be had. With
    ``thread_local=False`` other threads (a lease's renewer) may use its token."""
    lock = client().lock(
        name, timeout=ttl, blocking=wait is not None, blocking_timeout=wait, thread_local=thread_local
    )
    if not lock.acquire():
        raise Busy(name)
    try:
        yield lock
    finally:
        try:
            lock.release()
        except LockError:
            pass  # expired meanwhile: someone else may hold it now, which is fine


class Lease:
    """A held lock renewed in the background; see the module docstring."""

    def __init__(self, lock: redis.lock.Lock, ttl: float) -> None:
        self.lock = lock
        self.ttl = ttl
        self._lost = threading.Event()
        self._losing = threading.Lock()  # the renewer and a checkpoint may both see the loss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew_loop, name=f"lease:{lock.name}", daemon=True)

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self.renew()
            except LockLost:
                log.warning("lost lock %s; the holder stops at its next checkpoint", self.lock.name)
                return

    def renew(self) -> None:
        """Reset the TTL; raises LockLost if the lock is no longer ours."""
        if self._lost.is_set():
            raise LockLost(self.lock.name)
        try:
            self.lock.reacquire()
        except (LockError, RedisError) as exc:
            # A Redis error is treated as a loss too: we cannot tell whether the
            # key outlived it, so we must assume another holder may exist.
            with self._losing:
                first = not self._lost.is_set()
                self._lost.set()
            if first:
                _count_lost_lease()
            raise LockLost(self.lock.name) from exc

    def checkpoint(self) -> None:
        """Call before committing decisions: renews (proving the lock is still
        ours, for another full TTL) or raises LockLost."""
        self.renew()

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.ttl)


@contextmanager
def leased(name: str, *, ttl: float, wait: float | None) -> Iterator[Lease]:
    """Hold lock ``name`` as a :class:`Lease` (TTL ``ttl``, renewed while held)."""
    # thread_local=False: the renewer thread must see the token the holder got.
    with held(name, ttl=ttl, wait=wait, thread_local=False) as lock:
        lease = Lease(lock, ttl)
        lease.start()
        try:
            yield lease
        finally:
            lease.stop()  # before held() releases the lock


def decisions(wait: float | None = 60.0):
    """The fleet-wide decision lock, as a renewed :class:`Lease`."""
    return leased(DECISION_LOCK, ttl=settings.RACKWISE_DECISION_LOCK_TTL_S, wait=wait)


def action_lock(action_id: int):
    # Short-lived, and extended after every step: a killed worker's action is
    # picked up by reconcile once the lock lapses.
    return held(f"rackwise:lock:action:{action_id}", ttl=settings.RACKWISE_STALL_S, wait=None)


def _count_lost_lease() -> None:
    # For the alert. Best effort: a holder cut off from Redis cannot count its
    # loss (the queue-depth and worker checks see that outage instead).
    try:
        redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1, socket_timeout=1).incr(LEASES_LOST)
    except RedisError:
        log.warning("could not count the lost lease: Redis does not answer")


def leases_lost() -> int:
    """Decision leases lost so far, by every worker (never reset)."""
    return int(client().get(LEASES_LOST) or 0)


def is_held(name: str) -> bool:
    return bool(client().exists(name))
