"""What the cluster says, applied to Rackwise: a job that ended in the cluster
(completed, failed, cancelled) ends in Rackwise too, its GPUs released, through
the same job services as everything else.

Run by ``fleet.tasks.sync_cluster`` every ``RACKWISE_CLUSTER_SYNC_S`` (and
sooner when the simulated cluster knows a job is due to end). Every function
here is idempotent: a report applied twice, or one about a job Rackwise already
ended, changes nothing.
"""

from __future__ import annotations

import logging

from fleet.cluster.base import (
    JOB_CANCELLED,
    JOB_COMPLETED,
    JOB_ENDED,
    ClusterAdapter,
    ClusterUnavailable,
    JobReport,
)
from fleet.cluster.registry import get_adapter
from fleet.models import Job
from fleet.services.errors import Conflict
from fleet.services.execution import slurm_sync
from fleet.services.jobs import allocations as job_allocations
from fleet.services.jobs import lifecycle as job_lifecycle
from fleet.services.jobs import submit as job_services

log = logging.getLogger(__name__)


def apply_job_report(job_id: int, report: JobReport, *, attempt: int | None = None) -> str:
    """Apply what the cluster says of one Rackwise job. Returns what was done:
    ``completed``, ``failed``, ``cancelled``, or why nothing was (``running``,
    ``gone``, ``already <state>``, ``stale``).

    1. Only an end is acted on (pending and running change nothing here).
    2. ``attempt``: the job's attempt when the report was asked for. If the job
       has restarted since (a swap, a move), the report is about a run that is
       over and is ignored (checked under the job's lock, in the service).
    3. Completed or failed: :func:`fleet.services.jobs.allocations.finish_job`, with the
       cluster's end time; cancelled: the cancel path, without telling the
       cluster again. A job whose end the cluster may no longer report
       (:func:`fleet.services.jobs.lifecycle.cluster_may_end`) is left as it is.
    """
    if report.state not in JOB_ENDED:
        return "running"
    job = Job.objects.filter(pk=job_id).only("state", "external_id").first()
    if job is None:
        return "gone"
    if not job_lifecycle.cluster_may_end(job):
        return f"already {job.state}"
    why = report.reason or f"{report.state} in the cluster"
    try:
        if report.state == JOB_CANCELLED:
            job_services.cancel_job(
                None,
                job_id,
                reason=f"cancelled in the cluster: {why}"[:500],
                tell_cluster=False,
                expect_attempt=attempt,
            )
            return "cancelled"
        succeeded = report.state == JOB_COMPLETED
        job_allocations.finish_job(
            None,
            job_id,
            succeeded=succeeded,
            reason=why[:500],
            expect_attempt=attempt,
            finished_at=report.ended_at,
        )
        return "completed" if succeeded else "failed"
    except Conflict as exc:
        # Changed since it was read: ended by someone else, or restarted.
        return "stale" if "stale" in str(exc) else f"skipped: {exc}"


def sync_jobs(adapter: ClusterAdapter | None = None, job_ids: list[int] | None = None) -> dict:
    """Ask the cluster about Rackwise's placed, running and recovering jobs (and
    pending ones it holds) and apply what it says. Returns ``{"asked": n, "completed": [ids], "failed":
    [...], "cancelled": [...], "stale": [...]}``, or ``{"error": ...}`` when the
    cluster could not be reached (nothing changes; the next sync tries again).
    ``job_ids``: only these jobs."""
    adapter = adapter or get_adapter()
    may_end = Job.objects.filter(job_lifecycle.CLUSTER_MAY_END).order_by("pk")
    jobs = list(may_end if job_ids is None else may_end.filter(pk__in=job_ids))
    result: dict = {"asked": len(jobs), "completed": [], "failed": [], "cancelled": [], "stale": []}
    if not jobs:
        return result
    try:
        reports = adapter.job_states(jobs)
    except ClusterUnavailable as exc:
        log.warning("cluster sync: job states unavailable: %s", exc)
        return {"asked": len(jobs), "error": str(exc)}
    for job in jobs:
        report = reports.get(job.pk)
        if report is None or report.state not in JOB_ENDED:
            continue
        done = apply_job_report(job.pk, report, attempt=job.attempt)
        if done in result:
            result[done].append(job.pk)
    return result


def sync(adapter: ClusterAdapter | None = None) -> dict:
    """One sync with the cluster: what it says of jobs (and, where the cluster
    reports them, of nodes and of jobs to adopt). Returns one entry per part."""
    adapter = adapter or get_adapter()
    out: dict = {}
    if adapter.reports_fleet():
        # Topology, node states, adoption and reconcile first, so the jobs'
        # reports meet nodes as Slurm has them now.
        out["slurm"] = slurm_sync.sync(adapter)
    out["jobs"] = sync_jobs(adapter)
    return out
