"""The fleet's records: nodes, racks (NVLink domains), job requests and allocations.

Plain dataclasses; the indexes over them are kept by the Fleet (:mod:`placement.model.fleet`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

HEALTHY = "healthy"
FAILED = "failed"
DRAINING = "draining"
HEALTH_STATES = (HEALTHY, FAILED, DRAINING)

REQUIRED = "required"
PREFERRED = "preferred"
NONE = "none"
LOCALITIES = (REQUIRED, PREFERRED, NONE)


@dataclass
class Node:
    """A compute tray: ``gpus`` GPUs sharing one host, in slot ``index`` of ``rack``.

    ``used`` (bitmask of held GPU indices) and ``jobs`` are maintained by the Fleet.
    """

    id: str
    rack: str
    index: int
    gpus: int
    health: str = HEALTHY
    used: int = 0
    jobs: dict[str, int] = field(default_factory=dict)
    # How people name it (a hostname); messages use ``label``.
    name: str = ""

    @property
    def label(self) -> str:
        return self.name or self.id

    @property
    def free_gpus(self) -> int:
        return self.gpus - self.used.bit_count() if self.health == HEALTHY else 0

    @property
    def idle(self) -> bool:
        """Healthy and holding nothing: a whole free node."""
        return self.health == HEALTHY and self.used == 0

    def free_indices(self, count: int) -> tuple[int, ...]:
        """The ``count`` lowest free GPU indices (caller checked there are enough)."""
        out: list[int] = []
        for i in range(self.gpus):
            if not self.used >> i & 1:
                out.append(i)
                if len(out) == count:
                    break
        return tuple(out)


@dataclass
class Rack:
    """An NVLink domain. ``spare_nodes`` idle nodes are kept back from big gangs that
    cannot be preempted; small and preemptible jobs may borrow them."""

    id: str
    nodes: list[Node]
    spare_nodes: int = 2
    # Maintained by the Fleet: slot indices of healthy idle nodes, and how many nodes
    # host only small or preemptible jobs (they may be "borrowing" spare capacity:
    # recovery can reclaim those nodes).
    free: set[int] = field(default_factory=set)
    lent_nodes: int = 0
    # How people name it; messages use ``label``.
    name: str = ""
    # Slots of nodes at risk: a GPU there has a suspect verdict (a hardware
    # slowdown, an error rate rising below the drain threshold). Gangs and
    # recovery's swaps take other idle nodes first (``idle_slots``).
    at_risk: frozenset[int] = frozenset()

    @property
    def label(self) -> str:
        return self.name or self.id

    @property
    def gpus_per_node(self) -> int:
        return self.nodes[0].gpus if self.nodes else 0

    @functools.cached_property
    def size(self) -> int:
        return len(self.nodes)  # nodes are fixed for the life of a Rack

    @property
    def healthy(self) -> int:
        return sum(1 for n in self.nodes if n.health == HEALTHY)

    @property
    def free_count(self) -> int:
        return len(self.free)

    def unlent_spares(self) -> int:
        """Spare nodes still to keep idle: the policy minus nodes lent out already."""
        return max(0, self.spare_nodes - self.lent_nodes)

    def slice_offer(self) -> int:
        """Idle nodes this rack offers a non-preemptible big gang, keeping its spares."""
        return max(0, self.free_count - self.unlent_spares())

    def free_gpus(self) -> int:
        return sum(n.free_gpus for n in self.nodes)

    def idle_slots(self) -> list[int]:
        """Idle slots in slot order, nodes at risk last: a synchronous gang runs at
        the pace of its slowest GPU, and a node whose errors rise may fail under it."""
        ordered = sorted(self.free)
        if self.at_risk:
            ordered.sort(key=self.at_risk.__contains__)
        return ordered


@dataclass(frozen=True)
class JobRequest:
    """What a job asks for.

    Give ``num_gpus``, or ``num_nodes`` x ``gpus_per_node``. A job of at most one
    node's GPUs (and no ``num_nodes``) may share a node; a bigger one takes whole
    nodes as one gang. ``segment_nodes``: every segment of that many nodes must sit
    inside one rack. ``expected_duration`` and ``submit_time`` (seconds) feed the
    look-ahead of the queue-level scheduler; they are optional.
    """

    id: str
    num_gpus: int = 0
    num_nodes: int | None = None
    gpus_per_node: int | None = None
    segment_nodes: int | None = None
    locality: str = PREFERRED
    priority: int = 0
    preemptible: bool = True
    checkpoint_minutes: float = 60.0
    submit_time: float | None = None
    expected_duration: float | None = None
    tenant: str = ""

    def __post_init__(self) -> None:
        if self.locality not in LOCALITIES:
            raise ValueError(f"locality must be one of {LOCALITIES}, not {self.locality!r}")
        if self.num_nodes is not None:
            if self.num_nodes < 1:
                raise ValueError("num_nodes must be at least 1")
            if self.gpus_per_node is None or self.gpus_per_node < 1:
                raise ValueError("num_nodes needs gpus_per_node >= 1")
        elif self.num_gpus < 1:
            raise ValueError("num_gpus must be at least 1")
        if self.segment_nodes is not None and self.segment_nodes < 1:
            raise ValueError("segment_nodes must be at least 1")

    @property
    def total_gpus(self) -> int:
        if self.num_nodes is not None and self.gpus_per_node is not None:
            return self.num_nodes * self.gpus_per_node
        return self.num_gpus

    def is_small(self, gpus_per_node: int) -> bool:
        """True when the job fits on one node of this shape and may share it."""
        return self.num_nodes is None and self.num_gpus <= gpus_per_node

    def nodes_needed(self, gpus_per_node: int) -> int:
        """Whole nodes of this shape the gang needs (0 if the shape cannot host it)."""
        if self.num_nodes is not None and self.gpus_per_node is not None:
            return self.num_nodes if self.gpus_per_node <= gpus_per_node else 0
        return math.ceil(self.num_gpus / gpus_per_node)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class Allocation:
    """Where a running job sits: node id -> GPU indices, grouped into segments."""

    job: JobRequest
    nodes: dict[str, tuple[int, ...]]
    segments: list[list[str]] = field(default_factory=list)
    # When the job is expected to end (seconds, same clock as ``now``); look-ahead
    # uses it to tell when reserved racks will have room. None: unknown.
    expected_end: float | None = None
    # When the current run started making progress (after any restart); with the
    # job's checkpoint interval it tells how much work a stop would lose now.
    started_at: float | None = None

    @property
    def job_id(self) -> str:
        return self.job.id

    @property
    def gpus(self) -> int:
        return sum(len(g) for g in self.nodes.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job.id,
            "job": self.job.to_dict(),
            "nodes": {k: list(v) for k, v in self.nodes.items()},
            "segments": [list(s) for s in self.segments],
            "expected_end": self.expected_end,
            "started_at": self.started_at,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Allocation:
        return cls(
            JobRequest(**data["job"]),
            {k: tuple(v) for k, v in data["nodes"].items()},
            [list(s) for s in data.get("segments", [])],
            data.get("expected_end"),
            data.get("started_at"),
        )


def racks_needed(nodes: int, nodes_per_rack: int) -> int:
    """The fewest racks that can hold ``nodes`` nodes at all."""
    return max(1, math.ceil(nodes / max(1, nodes_per_rack)))
