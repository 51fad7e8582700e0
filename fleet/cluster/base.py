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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from fleet.cluster.steps import Step
    from fleet.models import Action, Job

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


class ClusterAdapter(Protocol):
    name: str

    def perform(self, action: Action, index: int, step: Step) -> Outcome:
        """Do the step in the cluster: Outcome(DONE), or Outcome(WAITING) (call
        again later). Raise StepFailed or ClusterUnavailable."""

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


def get_adapter() -> ClusterAdapter:
    """The adapter chosen by ``RACKWISE_CLUSTER``."""
    from django.conf import settings

    kind = settings.RACKWISE_CLUSTER
    if kind == "webhook":
        from fleet.cluster.webhook import WebhookAdapter

        return WebhookAdapter.from_settings()
    if kind == "slurm":
        from fleet.cluster.slurm import SlurmAdapter

        return SlurmAdapter.from_settings()
    from fleet.cluster.simulated import SimulatedAdapter

    return SimulatedAdapter.from_settings()
