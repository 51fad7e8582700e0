"""The interface every cluster adapter implements, and what adapters report.

A service hands an adapter one typed step of an action at a time
(:meth:`ClusterAdapter.perform`). The adapter does the cluster side, and the
service then applies the database side in a transaction. Every step must be
safe to run twice (Celery delivers at least once): an adapter checks what the
cluster already has before acting.

Errors:

* :class:`StepFailed`: the cluster refused the step for good; the action fails.
* :class:`ClusterUnavailable`: the cluster could not be reached or answered
  nonsense; the action stays where it was and the step is retried with backoff.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from fleet.models import Action, Job
    from fleet.steps import Step

DONE = "done"
WAITING = "waiting"  # the step goes on outside (a callback, a job still starting)


@dataclass(frozen=True)
class Outcome:
    """What :meth:`ClusterAdapter.perform` did. ``external_id``: the job's id in
    the cluster when this step gave it one (the service stores it on the job)."""

    status: str  # DONE or WAITING
    external_id: str | None = None
    message: str = ""


class StepFailed(Exception):
    """The cluster could not carry out a step, and retrying will not help."""


class ClusterUnavailable(Exception):
    """The cluster is unreachable (or timed out); retry later."""


# Job states as a cluster reports them.
JOB_PENDING = "pending"
JOB_RUNNING = "running"
JOB_COMPLETED = "completed"
JOB_FAILED = "failed"
JOB_CANCELLED = "cancelled"
JOB_ENDED = (JOB_COMPLETED, JOB_FAILED, JOB_CANCELLED)

# Node states as a cluster reports them, already in Rackwise's terms.
NODE_HEALTHY = "healthy"
NODE_DRAINING = "draining"
NODE_FAILED = "failed"


@dataclass(frozen=True)
class NodeReport:
    hostname: str
    state: str  # NODE_*
    reason: str = ""
    jobs: tuple[str, ...] = ()  # external ids of the jobs on it


@dataclass(frozen=True)
class JobReport:
    external_id: str
    state: str  # JOB_*
    hostnames: tuple[str, ...] = ()
    started_at: dt.datetime | None = None
    ended_at: dt.datetime | None = None
    reason: str = ""
    # What the cluster knows of a job it holds for Rackwise to place (adoption).
    name: str = ""
    user: str = ""
    num_nodes: int | None = None
    gpus_per_node: int | None = None
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class LogChunk:
    """Bytes of a job's log, as :meth:`ClusterAdapter.read_log` read them.

    ``data`` starts at byte ``offset`` of the log, which is ``size`` bytes long
    now. ``reason`` is set (and ``data`` empty) when the cluster has no log to
    give: the job never ran there, its output is gone, or this cluster kind
    keeps none. The read service (``fleet.services.read.job_logs``) cuts it
    into lines, redacts them and tells the client where to go on."""

    data: bytes = b""
    offset: int = 0
    size: int = 0
    reason: str = ""

    @property
    def available(self) -> bool:
        return not self.reason


# An adapter's report of how far into a step it is (0 to 1).
Progress = Callable[[float], None]


class ClusterAdapter(Protocol):
    name: str

    def perform(self, action: Action, index: int, step: Step, report: Progress | None = None) -> Outcome:
        """Do the step in the cluster: Outcome(DONE), or Outcome(WAITING) (call
        again later). Raise StepFailed or ClusterUnavailable. ``report(done)``
        says how far into the step it is (0 to 1): the service records it and
        shows it, since adapters write no rows."""

    def reports_fleet(self) -> bool:
        """Whether this cluster reports its nodes' states, the jobs held for
        Rackwise to adopt and its topology: then its own sync
        (``fleet.services.execution.slurm_sync``) runs with every cluster sync."""

    def after_step(self, action: Action, index: int, step: Step) -> None:
        """Called once the step's database change has committed."""

    def cancel(self, job: Job) -> None:
        """A job Rackwise cancelled or finished: end it in the cluster (idempotent)."""

    def set_node_state(self, hostname: str, state: str, reason: str) -> None:
        """Rackwise changed a node (NODE_HEALTHY: undrain / return to service,
        NODE_DRAINING, NODE_FAILED): mirror it in the cluster, idempotently.
        Called by the node services before they commit; raise ClusterUnavailable
        and the change is refused, so the two sides never disagree for long."""

    def node_states(self) -> dict[str, NodeReport] | None:
        """Every node the cluster knows, by hostname; None if this cluster kind
        does not report nodes (Rackwise's heartbeats are then the source)."""

    def job_states(self, jobs: list[Job]) -> dict[int, JobReport]:
        """What the cluster says of these Rackwise jobs, by Rackwise job id
        (a job the cluster does not know is absent)."""

    def read_log(self, job: Job, offset: int, limit: int, *, from_end: bool = False) -> LogChunk:
        """At most ``limit`` bytes of the job's output from byte ``offset``
        (``from_end``: the last ``limit`` bytes, ``offset`` ignored); an
        offset past the end reads nothing. ``LogChunk(reason=...)`` when there
        is no log to read. Raise ClusterUnavailable if the cluster does not answer."""
