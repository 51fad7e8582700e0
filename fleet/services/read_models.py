"""Read models: the fleet summary and the fragmentation report, computed once
per change and shared by every web process, console and scrape through the
cache (Redis). ``/api/fleet/summary/``, ``/api/fleet/fragmentation/``, the Fleet
page and ``/metrics`` all read them, so they show the same figures.

A stored figure carries the change generation it was computed at
(``fleet.read_cache``, bumped on commit of every change to racks, jobs and
actions). It is served while the generation has not moved, and while it is
younger than ``RACKWISE_READ_MODEL_MAX_AGE_S`` even if it has: a busy fleet then
costs one computation per interval, not one per reader. With the cache down, or
``RACKWISE_READ_MODELS`` off, every read computes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.cache import cache

from fleet import read_cache
from fleet.services.defrag import fragmentation_report
from fleet.services.summary import fleet_summary
from placement.fragmentation import FragmentationReport

PREFIX = "read-models:"


def _read(name: str, compute: Callable[[], Any]) -> Any:
    generation = read_cache.generation() if settings.RACKWISE_READ_MODELS else None
    if generation is None:
        return compute()
    key = PREFIX + name
    try:
        stored = cache.get(key)
    except Exception:
        stored = None
    if stored is not None:
        at, computed_at, value = stored
        if at == generation or time.time() - computed_at < settings.RACKWISE_READ_MODEL_MAX_AGE_S:
            return value
    value = compute()
    try:
        cache.set(key, (generation, time.time(), value), timeout=3600)
    except Exception:
        pass
    return value


def summary() -> dict:
    """``fleet_summary()``, from the shared read model."""
    return _read("summary", fleet_summary)


def fragmentation() -> FragmentationReport:
    """``fragmentation_report()``, from the shared read model."""
    return _read("fragmentation", fragmentation_report)
