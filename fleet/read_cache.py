"""A fleet-wide change generation in the shared cache (Redis), for the read
models (``fleet.services.read.read_models``): every committed change to racks, jobs
or actions bumps it (``fleet.events`` does, on commit, before the events go
out), so a read model knows whether what it computed is still the fleet's.
Never fails a writer: a cache that does not answer only means readers compute.

A bump also asks a worker to recompute the read models
``RACKWISE_READ_MODEL_REFRESH_S`` later, once per interval however many changes
come in it (a key that lives for the interval), so the work is done once per
change burst, off the request path; and only while someone reads them (a read
in the last ``READ_RECENTLY_S``): with no console open and no scrape, a change
costs nothing more."""

from __future__ import annotations

import logging
import math

from django.conf import settings
from django.core.cache import cache

from fleet import dispatch

log = logging.getLogger(__name__)

KEY = "read-models:generation"
REFRESH_QUEUED = "read-models:refresh-queued"
READ_RECENTLY = "read-models:read-recently"
READ_RECENTLY_S = 120  # a scrape or a console's totals come at least every 30 s


def bump() -> None:
    try:
        if not cache.add(KEY, 1, timeout=None):
            cache.incr(KEY)
        if settings.RACKWISE_READ_MODELS:
            interval = settings.RACKWISE_READ_MODEL_REFRESH_S
            if cache.get(READ_RECENTLY) and cache.add(REFRESH_QUEUED, 1, timeout=max(1, math.ceil(interval))):
                dispatch.refresh_read_models_in(interval)
    except Exception:
        log.warning("could not bump the read models' generation", exc_info=True)


def generation() -> int | None:
    """The current generation, or None when the cache does not answer."""
    try:
        return cache.get_or_set(KEY, 0, timeout=None)
    except Exception:
        return None


def refresh_started() -> None:
    """A refresh is starting: a change from now on asks for the next one."""
    try:
        cache.delete(REFRESH_QUEUED)
    except Exception:
        pass


def read() -> None:
    """Someone read the read models: keep refreshing them after changes."""
    try:
        cache.set(READ_RECENTLY, 1, timeout=READ_RECENTLY_S)
    except Exception:
        pass
