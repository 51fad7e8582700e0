"""Rack version bookkeeping shared by every service that changes a rack, and the
rack's fabric state (the one writer of ``Rack.fabric_degraded``)."""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connection, transaction
from django.db.models import F
from django.db.models.expressions import RawSQL

from fleet import dispatch, events
from fleet.choices import ActionState
from fleet.models import Action, Allocation, Rack
from fleet.services import audit, webhooks


def bump_versions(rack_ids: Iterable[int]) -> None:
    """Advance the version of each rack touched by the current transaction, so a
    live view that missed an update notices the gap and re-fetches; and stamp
    them with this transaction (``change_stamp``), so a console that reconnects
    asks only for what changed while it was away.

    Every change of a rack comes through here (a node failing or returning, a
    job's GPUs freed), so this is also where a proposal waiting on one of these
    racks is asked to be re-checked: the change may have made it obsolete."""
    ids = sorted(set(rack_ids))
    if ids:
        Rack.objects.filter(id__in=ids).update(version=F("version") + 1, changed_xid=change_stamp())
        events.racks_changed(ids)
        if _proposals_waiting_in(ids):
            dispatch.recheck_proposals_soon(ids)


def racks_held_by(job_ids: Iterable[int]) -> set[int]:
    """The racks where these jobs hold GPUs now."""
    return set(
        Allocation.objects.filter(job_id__in=list(job_ids), released_at__isnull=True)
        .values_list("gpu__node__rack_id", flat=True)
        .distinct()
    )


def change_stamp() -> RawSQL:
    """What ``Rack.changed_xid`` is set to by a change: the current transaction's
    id on PostgreSQL. The console's ``?since=`` answers "which racks changed since
    the cursor I gave you" with it (see ``change_cursor``).

    Why not a sequence number, or the version: a transaction that took number 10
    can commit after one that took 11, so a reader that saw 11 and answered
    "since 12" would miss 10 for good. Transaction ids have the same problem, but
    PostgreSQL says which are still running (the snapshot's xmin), and that is
    what makes the cursor safe. In a savepoint this is still the top-level
    transaction's id, the one whose commit makes the change visible."""
    return RawSQL("pg_current_xact_id()::text::bigint", [])


def change_cursor() -> int:
    """A cursor for the console's ``?since=``: read it BEFORE the racks it covers.

    On PostgreSQL it is the current snapshot's xmin, the oldest transaction still
    running. Every transaction below it has ended, so whatever it changed is
    visible to the rows read after this; every one whose change those rows miss
    was running or not yet begun, so its id (and the ``changed_xid`` it sets) is
    at least the cursor. Racks with ``changed_xid >= cursor`` are then all that
    can have changed since: some the reader already has (harmless, it compares
    versions), none missed."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
        return int(cursor.fetchone()[0])


def _proposals_waiting_in(rack_ids: list[int]) -> bool:
    """Is a proposal waiting whose jobs hold GPUs in these racks? One indexed
    EXISTS, usually false: most of the time nothing waits for an operator."""
    return Action.objects.filter(
        state=ActionState.PROPOSED,
        jobs__allocations__released_at__isnull=True,
        jobs__allocations__gpu__node__rack_id__in=rack_ids,
    ).exists()


def set_fabric_state(actor, rack_id: int, degraded: str) -> bool:
    """Mark the rack's NVLink fabric degraded (``degraded``: why) or healthy
    (''), audited as ``rack.fabric`` and seen by the next scheduling pass (no
    new multi-node gangs go to a degraded rack); the long gangs on a degraded
    rack are proposed a move elsewhere (fleet.services.decisions.evacuation).
    Returns whether it changed."""
    with transaction.atomic():
        rack = Rack.objects.select_for_update().get(pk=rack_id)
        if rack.fabric_degraded == degraded:
            return False
        before = {"fabric_degraded": rack.fabric_degraded}
        rack.fabric_degraded = degraded[:500]
        rack.save(update_fields=["fabric_degraded"])
        audit.record(
            actor,
            "rack.fabric",
            rack,
            before=before,
            after={"fabric_degraded": rack.fabric_degraded},
            message=degraded or f"rack {rack.name}: NVLink fabric healthy again",
        )
        webhooks.emit("rack.fabric", webhooks.rack_fabric(rack))
        bump_versions([rack.pk])
        dispatch.schedule_soon()
        dispatch.after_commit("fleet.tasks.plan_evacuations")
    return True
