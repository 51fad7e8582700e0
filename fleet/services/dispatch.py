"""Enqueue background work once the current transaction commits.

Sending never breaks the caller: if the broker is unreachable the rows are
already committed, and the periodic reconcile pass re-enqueues whatever they say
is pending. That is what makes a lost message harmless."""

from __future__ import annotations

import logging

from django.db import transaction

log = logging.getLogger(__name__)


def _send(name: str, args: tuple, countdown: float | None = None) -> None:
    from rackwise.celery import app

    try:
        app.send_task(name, args=args, countdown=countdown)
    except Exception:  # broker down: reconcile will pick the work up
        log.warning("could not enqueue %s%s; reconcile will retry", name, args, exc_info=True)


def after_commit(name: str, *args) -> None:
    """Send task ``name`` (e.g. ``fleet.tasks.schedule_pending``) after commit."""
    # robust: even an error _send does not catch must not fail a committed request.
    transaction.on_commit(lambda: _send(name, args), robust=True)


def schedule_soon() -> None:
    after_commit("fleet.tasks.schedule_pending")


def recover_soon(job_id: int) -> None:
    after_commit("fleet.tasks.recover_job", job_id)


def execute_soon(action_id: int) -> None:
    after_commit("fleet.tasks.execute_action", action_id)


def recheck_proposals_soon(rack_ids: list[int]) -> None:
    """Re-check the proposals waiting on these racks (a node of theirs changed)."""
    after_commit("fleet.tasks.recheck_proposals", list(rack_ids))


def sync_cluster_in(seconds: float) -> None:
    """Ask the cluster what it did in ``seconds`` (after commit): the simulated
    cluster asks for this when a job it runs is due to end."""
    transaction.on_commit(lambda: _send("fleet.tasks.sync_cluster", (), countdown=max(0.0, seconds)), robust=True)


def refresh_read_models_in(seconds: float) -> None:
    """Recompute the shared read models in ``seconds`` (now: this runs on commit)."""
    _send("fleet.tasks.refresh_read_models", (), countdown=max(0.0, seconds))
