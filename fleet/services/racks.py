"""Rack version bookkeeping shared by every service that changes a rack."""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import F

from fleet import events
from fleet.choices import ActionState
from fleet.models import Action, Rack
from fleet.services import dispatch


def bump_versions(rack_ids: Iterable[int]) -> None:
    """Advance the version of each rack touched by the current transaction, so a
    live view that missed an update notices the gap and re-fetches.

    Every change of a rack comes through here (a node failing or returning, a
    job's GPUs freed), so this is also where a proposal waiting on one of these
    racks is asked to be re-checked: the change may have made it obsolete."""
    ids = sorted(set(rack_ids))
    if ids:
        Rack.objects.filter(id__in=ids).update(version=F("version") + 1)
        events.racks_changed(ids)
        if _proposals_waiting_in(ids):
            dispatch.recheck_proposals_soon(ids)


def _proposals_waiting_in(rack_ids: list[int]) -> bool:
    """Is a proposal waiting whose jobs hold GPUs in these racks? One indexed
    EXISTS, usually false: most of the time nothing waits for an operator."""
    return Action.objects.filter(
        state=ActionState.PROPOSED,
        jobs__allocations__released_at__isnull=True,
        jobs__allocations__gpu__node__rack_id__in=rack_ids,
    ).exists()
