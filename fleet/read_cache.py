"""A fleet-wide change generation in the shared cache (Redis), for the read
models (``fleet.services.read_models``): every committed change to racks, jobs
or actions bumps it (``fleet.events`` does, on commit, before the events go
out), so a read model knows whether what it computed is still the fleet's.
Never fails a writer: a cache that does not answer only means readers compute."""

from __future__ import annotations

import logging

from django.core.cache import cache

log = logging.getLogger(__name__)

KEY = "read-models:generation"


def bump() -> None:
    try:
        if not cache.add(KEY, 1, timeout=None):
            cache.incr(KEY)
    except Exception:
        log.warning("could not bump the read models' generation", exc_info=True)


def generation() -> int | None:
    """The current generation, or None when the cache does not answer."""
    try:
        return cache.get_or_set(KEY, 0, timeout=None)
    except Exception:
        return None
