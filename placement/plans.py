"""Plan dataclasses returned by the decisions. All are JSON-serialisable via to_dict()."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from placement.model import Allocation, JobRequest


@dataclass
class PlacementPlan:
    """Where a job goes (``placed``) or why it waits (``reason``).

    ``choices`` holds one reason per choice made (rack picked, segment split...).
    """

    job_id: str
    policy: str
    placed: bool
    reason: str
    nodes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    segments: list[list[str]] = field(default_factory=list)
    racks: list[str] = field(default_factory=list)
    choices: list[str] = field(default_factory=list)

    def allocation(self, job: JobRequest) -> Allocation:
        if not self.placed:
            raise ValueError(f"job {self.job_id} was not placed: {self.reason}")
        return Allocation(job, dict(self.nodes), [list(s) for s in self.segments])

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "policy": self.policy,
            "placed": self.placed,
            "reason": self.reason,
            "nodes": {k: list(v) for k, v in self.nodes.items()},
            "segments": [list(s) for s in self.segments],
            "racks": list(self.racks),
            "choices": list(self.choices),
        }


def not_placed(job: JobRequest, policy: str, reason: str) -> PlacementPlan:
    return PlacementPlan(job.id, policy, False, reason)


@dataclass
class WhatIf:
    """What would happen to a job submitted now (:func:`placement.place.what_if`).

    ``plan``: where it would start now (None: it waits, for ``reason``).
    ``expected_start``: when it is expected to start (now if it starts; None: no
    estimate, some end it waits for is unknown or beyond the window).
    ``largest_free``: the largest slice it could use now, in ``unit`` (nodes one rack
    offers a gang; for a gang in segments, the nodes all racks offer in whole
    segments; GPUs of one node for a single-node job; see
    :func:`placement.place.largest_free`). ``ahead``: waiting jobs before it.
    """

    job_id: str
    plan: PlacementPlan | None
    reason: str
    expected_start: float | None
    largest_free: int
    unit: str
    ahead: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "starts_now": self.plan is not None,
            "plan": self.plan.to_dict() if self.plan else None,
            "reason": self.reason,
            "expected_start": self.expected_start,
            "largest_free": self.largest_free,
            "unit": self.unit,
            "ahead": self.ahead,
        }


@dataclass
class SchedulePlan:
    """A queue pass: the jobs started now, in order, and why each other one waits."""

    policy: str
    placements: list[PlacementPlan] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)
    reservation: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "placements": [p.to_dict() for p in self.placements],
            "waiting": dict(self.waiting),
            "reservation": self.reservation,
        }


@dataclass
class RecoveryPlan:
    """What to do about failed nodes of a running job.

    ``action``: ``swap`` (replace failed nodes in the same rack), ``preempt_swap``
    (free a node by preempting ``preempted`` jobs, then swap), ``move`` (whole job to
    ``new_nodes``), ``requeue``, or ``none`` (the job was not hit).
    """

    job_id: str
    action: str
    reason: str
    swaps: dict[str, str] = field(default_factory=dict)
    preempted: list[str] = field(default_factory=list)
    new_nodes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    new_segments: list[list[str]] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "action": self.action,
            "reason": self.reason,
            "swaps": dict(self.swaps),
            "preempted": list(self.preempted),
            "new_nodes": {k: list(v) for k, v in self.new_nodes.items()},
            "new_segments": [list(s) for s in self.new_segments],
            "steps": list(self.steps),
        }


@dataclass
class Move:
    """One defrag step: checkpoint ``job_id``, stop it, restart it on ``to_nodes``."""

    job_id: str
    from_nodes: list[str]
    to_nodes: dict[str, tuple[int, ...]]
    to_segments: list[list[str]]
    cost_gpu_hours: float
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "from_nodes": list(self.from_nodes),
            "to_nodes": {k: list(v) for k, v in self.to_nodes.items()},
            "to_segments": [list(s) for s in self.to_segments],
            "cost_gpu_hours": round(self.cost_gpu_hours, 6),
            "reason": self.reason,
        }


@dataclass
class DefragPlan:
    """Ordered moves, their cost, and what they buy."""

    target: str
    feasible: bool
    reason: str
    moves: list[Move] = field(default_factory=list)
    cost_gpu_hours: float = 0.0
    jobs_made_placeable: list[str] = field(default_factory=list)
    fragmentation_before: float = 0.0
    fragmentation_after: float = 0.0
    free_racks_before: int = 0
    free_racks_after: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "feasible": self.feasible,
            "reason": self.reason,
            "moves": [m.to_dict() for m in self.moves],
            "cost_gpu_hours": round(self.cost_gpu_hours, 6),
            "jobs_made_placeable": list(self.jobs_made_placeable),
            "fragmentation_before": round(self.fragmentation_before, 6),
            "fragmentation_after": round(self.fragmentation_after, 6),
            "free_racks_before": self.free_racks_before,
            "free_racks_after": self.free_racks_after,
        }
