"""Enqueue background work once the current transaction commits.

Sending never breaks the caller: if the broker is unreachable the rows are
already committed, and the periodic reconcile pass re-enqueues whatever they say
is pending. That is what makes a lost message harmless."""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.db import transaction
from redis.exceptions import RedisError

from fleet import locks

log = logging.getLogger(__name__)


def _send(name: str, args: tuple, countdown: float | None = None) -> None:
    from rackwise.celery import app  # the Celery app loads the task modules, which import services

    try:
        app.send_task(name, args=args, countdown=countdown)
    except Exception:  # broker down: reconcile will pick the work up
        log.warning("could not enqueue %s%s; reconcile will retry", name, args, exc_info=True)


def after_commit(name: str, *args) -> None:
    """Send task ``name`` (e.g. ``fleet.tasks.schedule_pending``) after commit."""
    # robust: even an error _send does not catch must not fail a committed request.
    transaction.on_commit(lambda: _send(name, args), robust=True)


def _queued_key(name: str, args: tuple) -> str:
    return f"rackwise:queued:{name}:{','.join(map(str, args))}"


def send_once(name: str, *args, countdown: float | None = None) -> bool:
    """Send ``name(*args)`` unless the same message is already queued and no
    worker has taken it yet (:func:`taken`), so a reconcile pass, an approval
    and a retry never stack copies of one piece of work. The mark expires
    ``RACKWISE_STALL_S`` after the message is due, so a message the broker lost
    is sent again then. Returns whether it was sent."""
    try:
        ttl = int((countdown or 0) + settings.RACKWISE_STALL_S)
        fresh = locks.client().set(_queued_key(name, args), 1, nx=True, ex=max(1, ttl))
    except RedisError:
        fresh = True  # no Redis, no broker either: _send logs it, reconcile retries
    if fresh:
        _send(name, args, countdown)
    return bool(fresh)


def taken(name: str, *args) -> None:
    """A worker has taken ``name(*args)``: the next request for it is sent again."""
    try:
        locks.client().delete(_queued_key(name, args))
    except RedisError:
        pass  # the mark expires on its own


def schedule_soon() -> None:
    after_commit("fleet.tasks.schedule_pending")


def recover_soon(job_id: int) -> None:
    transaction.on_commit(lambda: send_once("fleet.tasks.recover_job", job_id), robust=True)


def execute_soon(action_id: int) -> None:
    transaction.on_commit(lambda: send_once("fleet.tasks.execute_action", action_id), robust=True)


def recheck_proposals_soon(rack_ids: list[int]) -> None:
    """Re-check the proposals waiting on these racks (a node of theirs changed)."""
    after_commit("fleet.tasks.recheck_proposals", list(rack_ids))


def sync_cluster_in(seconds: float) -> None:
    """Ask the cluster what it did in ``seconds`` (after commit): the simulated
    cluster asks for this when a job it runs is due to end. Requests due in the
    same second share one message, sent at that second's end, and the task
    skips a request that a sync begun after it was due has answered
    (``fleet.tasks.sync_cluster``)."""
    seconds = max(0.0, seconds)

    def send() -> None:
        now = time.time()
        due = int(now + seconds) + 1  # the end of the second it is due in
        try:
            first = locks.client().set(f"rackwise:queued:sync:{due}", 1, nx=True, ex=int(seconds) + 60)
        except RedisError:
            first = True
        if first:
            _send("fleet.tasks.sync_cluster", (due,), countdown=due - now)

    transaction.on_commit(send, robust=True)


def refresh_read_models_in(seconds: float) -> None:
    """Recompute the shared read models in ``seconds`` (now: this runs on commit)."""
    _send("fleet.tasks.refresh_read_models", (), countdown=max(0.0, seconds))
