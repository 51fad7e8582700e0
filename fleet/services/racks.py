"""Rack version bookkeeping shared by every service that changes a rack."""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import F

from fleet import events
from fleet.models import Rack


def bump_versions(rack_ids: Iterable[int]) -> None:
    """Advance the version of each rack touched by the current transaction, so a
    live view that missed an update notices the gap and re-fetches."""
    ids = sorted(set(rack_ids))
    if ids:
        Rack.objects.filter(id__in=ids).update(version=F("version") + 1)
        events.racks_changed(ids)
