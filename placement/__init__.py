"""Rackwise placement engine: pure Python, no Django.

Public entry points (see placement/README.md):
place, schedule, recover, defragment, fragmentation, validate.
"""

from placement.model import (
    Allocation,
    Fleet,
    JobRequest,
    Node,
    Rack,
)
from placement.place import can_ever_fit, place, schedule
from placement.plans import DefragPlan, Move, PlacementPlan, RecoveryPlan, SchedulePlan
from placement.validate import InvariantError, Violation, validate

__all__ = [
    "Allocation",
    "DefragPlan",
    "Fleet",
    "InvariantError",
    "JobRequest",
    "Move",
    "Node",
    "PlacementPlan",
    "Rack",
    "RecoveryPlan",
    "SchedulePlan",
    "Violation",
    "can_ever_fit",
    "place",
    "schedule",
    "validate",
]
