"""Read models: the fleet summary and the fragmentation report, computed once
per change and shared by every web process, console and scrape through the
cache (Redis). ``/api/fleet/summary/``, ``/api/fleet/fragmentation/``, the Fleet
page, the chart's samples (``fleet.services.read.metrics.record_sample``) and
``/metrics`` all read them, so they show the same figures.

A stored figure carries the change generation it was computed at
(``fleet.read_cache``, bumped on commit of every change to racks, jobs and
actions). A worker recomputes them ``RACKWISE_READ_MODEL_REFRESH_S`` after a
change (:func:`refresh`, asked for by the bump), so readers find them computed.
A reader serves a stored figure while the generation has not moved, and while it
is younger than ``RACKWISE_READ_MODEL_MAX_AGE_S`` even if it has (the worker's
refresh is on its way); past that, or with nothing stored, the reader computes.
With the cache down, or ``RACKWISE_READ_MODELS`` off, every read computes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.cache import cache

from fleet import read_cache
from fleet.services.decisions.defrag import fragmentation_report
from fleet.services.read.summary import fleet_summary
from placement.fragmentation import FragmentationReport

# v2: the fragmentation report's fields changed (one definition, issue 27); a
# report stored under the old key would unpickle without them.
PREFIX = "read-models:v2:"


def _read(name: str, compute: Callable[[], Any]) -> Any:
    generation = read_cache.generation() if settings.RACKWISE_READ_MODELS else None
    if generation is None:
        return compute()
    read_cache.read()
    key = PREFIX + name
    try:
        stored = cache.get(key)
    except Exception:
        stored = None
    if stored is not None:
        at, computed_at, value = stored
        if at == generation or time.time() - computed_at < settings.RACKWISE_READ_MODEL_MAX_AGE_S:
            return value
    return _store(key, generation, compute())


def _store(key: str, generation: int, value: Any) -> Any:
    try:
        cache.set(key, (generation, time.time(), value), timeout=3600)
    except Exception:
        pass
    return value


MODELS: dict[str, Callable[[], Any]] = {"summary": fleet_summary, "fragmentation": fragmentation_report}


def refresh() -> int | None:
    """Compute every read model now and store it at the generation read before
    computing (a change meanwhile leaves it stale, and asks for another refresh).
    Returns that generation; None when there is no cache to store in."""
    read_cache.refresh_started()
    generation = read_cache.generation() if settings.RACKWISE_READ_MODELS else None
    if generation is None:
        return None
    for name, compute in MODELS.items():
        _store(PREFIX + name, generation, compute())
    return generation


def summary() -> dict:
    """``fleet_summary()``, from the shared read model."""
    return _read("summary", MODELS["summary"])


def fragmentation() -> FragmentationReport:
    """``fragmentation_report()``, from the shared read model."""
    return _read("fragmentation", MODELS["fragmentation"])
