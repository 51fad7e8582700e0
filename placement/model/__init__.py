"""The fleet model: racks (NVLink domains) of nodes of GPUs, jobs and allocations.

Everything the decisions read is here: the records (:mod:`placement.model.records`)
and the :class:`Fleet` that holds them with its indexes (:mod:`placement.model.fleet`).
Import the names from ``placement.model``.
"""

from placement.model.fleet import CapacityError, Fleet, as_allocations
from placement.model.records import (
    DRAINING,
    FAILED,
    HEALTH_STATES,
    HEALTHY,
    LOCALITIES,
    NONE,
    PREFERRED,
    REQUIRED,
    Allocation,
    JobRequest,
    Node,
    Rack,
    racks_needed,
)

__all__ = [
    "DRAINING",
    "FAILED",
    "HEALTHY",
    "HEALTH_STATES",
    "LOCALITIES",
    "NONE",
    "PREFERRED",
    "REQUIRED",
    "Allocation",
    "CapacityError",
    "Fleet",
    "JobRequest",
    "Node",
    "Rack",
    "as_allocations",
    "racks_needed",
]
