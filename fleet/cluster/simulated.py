"""The simulated cluster (``RACKWISE_CLUSTER=simulated``, the default): each
step takes a realistic time, with progress reports for the console, and may
fail by injection (``RACKWISE_SIM_FAILURE_RATE``, or given steps for certain:
``fail_at``). A job ends in this cluster
once its expected duration (times ``RACKWISE_SIM_TIME_SCALE``) has passed since
it started: :meth:`SimulatedAdapter.job_states` reports it completed, and the
sync service (:mod:`fleet.services.execution.cluster_sync`) finishes it in Rackwise, as
it would a job a real cluster reports ended.

So that demo jobs end on time without a fast beat, the start of a job asks for
a sync at the moment it is due to end (:func:`fleet.dispatch.sync_cluster_in`,
a task sent by name: this module never imports ``fleet.tasks``). The periodic
sync (``RACKWISE_CLUSTER_SYNC_S``) catches an end whose message was lost.

Its jobs write logs too (:meth:`SimulatedAdapter.read_log`): lines drawn from
the job's timeline (start, progress, checkpoints, end), the same for every
reader at a given moment and only ever appended to as time passes, so a
reader's byte offsets stay valid.
"""

from __future__ import annotations

import random
import time
from collections.abc import Collection
from datetime import UTC, timedelta

from django.conf import settings
from django.utils import timezone

from fleet import dispatch
from fleet.choices import FINISHED_JOB_STATES, JobState
from fleet.cluster.base import (
    DONE,
    JOB_COMPLETED,
    JOB_PENDING,
    JOB_RUNNING,
    JobReport,
    LogChunk,
    NodeReport,
    Outcome,
    Progress,
    StepFailed,
)
from fleet.models import Action, Job
from fleet.steps import Allocate, Restart, Start, Step

# Relative duration of each op (times RACKWISE_SIM_STEP_SECONDS).
SIM_DURATIONS = {
    "checkpoint": 2.0,
    "stop": 1.0,
    "preempt": 1.5,
    "requeue": 0.5,
    "swap": 0.5,
    "allocate": 0.0,
    "start": 1.0,
    "restart": 1.5,
    "drain": 0.2,
    "undrain": 0.2,
}


# A simulated log stops growing at this many progress and checkpoint lines
# (a job without an expected duration checkpointing every few scaled seconds).
SIM_LOG_MAX_LINES = 2000


def _stamp(at) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class SimulatedAdapter:
    name = "simulated"

    def __init__(
        self,
        step_seconds: float,
        failure_rate: float,
        time_scale: float,
        seed: int | None = None,
        fail_at: Collection[int] = (),
    ) -> None:
        self.step_seconds = step_seconds
        self.failure_rate = failure_rate
        self.time_scale = time_scale
        self.rng = random.Random(seed)
        # Step indices that fail for certain (tests, demos of a failure midway);
        # a rollback's steps are numbered after the plan's and never match.
        self.fail_at = frozenset(fail_at)

    @classmethod
    def from_settings(cls) -> SimulatedAdapter:
        return cls(
            settings.RACKWISE_SIM_STEP_SECONDS,
            settings.RACKWISE_SIM_FAILURE_RATE,
            settings.RACKWISE_SIM_TIME_SCALE,
        )

    def perform(self, action: Action, index: int, step: Step, report: Progress | None = None) -> Outcome:
        duration = SIM_DURATIONS.get(step.op, 0.5) * self.step_seconds
        deadline = time.monotonic() + duration
        # Report progress within the step a few times a second, for the console.
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(0.25, left))
            if report is not None:
                report(1 - max(0.0, deadline - time.monotonic()) / duration)
        if index in self.fail_at:
            raise StepFailed(f"simulated failure injected in {step.op} (step {index + 1})")
        if self.failure_rate and self.rng.random() < self.failure_rate:
            raise StepFailed(f"simulated failure injected in {step.op}")
        if isinstance(step, Allocate):
            # The simulated cluster names its jobs too, as a real one does.
            return Outcome(DONE, external_id=f"sim-{step.job}")
        return Outcome(DONE)

    def reports_fleet(self) -> bool:
        return False  # its nodes are Rackwise's own; jobs end by their expected duration

    def after_step(self, action: Action, index: int, step: Step) -> None:
        if not isinstance(step, Start | Restart):
            return
        job = Job.objects.filter(pk=step.job).values("expected_duration_s", "started_at").first()
        if job and job["expected_duration_s"] and job["started_at"]:
            end = self._end(job["started_at"], job["expected_duration_s"])
            # A little after the end, so the sync finds it passed.
            dispatch.sync_cluster_in((end - timezone.now()).total_seconds() + 0.05)

    def _end(self, started_at, expected_duration_s: int):
        return started_at + timedelta(seconds=expected_duration_s * self.time_scale)

    def cancel(self, job: Job) -> None:
        return None  # nothing runs anywhere

    def set_node_state(self, hostname: str, state: str, reason: str) -> None:
        return None  # Rackwise's node rows are the whole simulated cluster

    def node_states(self) -> dict[str, NodeReport] | None:
        return None  # heartbeats (or nothing) are the source of node health

    def job_states(self, jobs: list[Job]) -> dict[int, JobReport]:
        """Running jobs past their expected duration are completed; other
        running jobs run; placed and recovering jobs wait."""
        now = timezone.now()
        reports: dict[int, JobReport] = {}
        for job in jobs:
            external = job.external_id or f"sim-{job.pk}"
            if job.state == JobState.RUNNING and job.started_at is not None:
                end = self._end(job.started_at, job.expected_duration_s) if job.expected_duration_s else None
                if end is not None and end <= now:
                    reports[job.pk] = JobReport(
                        external,
                        JOB_COMPLETED,
                        started_at=job.started_at,
                        ended_at=end,
                        reason="completed (simulated)",
                    )
                else:
                    reports[job.pk] = JobReport(external, JOB_RUNNING, started_at=job.started_at)
            elif job.state in (JobState.PLACED, JobState.RECOVERING):
                reports[job.pk] = JobReport(external, JOB_PENDING)
        return reports

    def read_log(self, job: Job, offset: int, limit: int, *, from_end: bool = False) -> LogChunk:
        if job.started_at is None:
            return LogChunk(reason="the job has not started: nothing has run, so there is no log yet")
        data = "".join(line + "\n" for line in self.log_lines(job, timezone.now())).encode()
        size = len(data)
        start = max(0, size - limit) if from_end else min(max(0, offset), size)
        return LogChunk(data=data[start : start + limit], offset=start, size=size)

    def log_lines(self, job: Job, now) -> list[str]:
        """The job's log as it stands at ``now``: its start, its progress each
        tenth of its (scaled) expected duration, a checkpoint every (scaled)
        ``checkpoint_interval_s``, and its end once it has finished. A job with
        a command prints it first, as a script run with ``set -x`` does (the
        read service redacts what looks secret), and its environment's names
        (never their values, which the API withholds)."""
        start = job.started_at
        if start is None:
            return []
        end = job.finished_at if job.state in FINISHED_JOB_STATES and job.finished_at else None
        until = min(end or now, now)
        spec = (job.cluster_spec or {}).get("slurm") or {}
        shape = (
            f"{job.num_nodes} node(s) x {job.gpus_per_node} GPU(s)"
            if job.num_nodes
            else f"{job.num_gpus} GPU(s)"
        )
        lines = [f"{_stamp(start)} [sim] job #{job.pk} {job.name}: started, {shape}"]
        if spec.get("command"):
            lines.append(f"{_stamp(start)} [sim] + {spec['command']}")
        if spec.get("env"):
            lines.append(f"{_stamp(start)} [sim] environment: {', '.join(sorted(spec['env']))}")
        events: list[tuple[float, int, str]] = []
        expected = (job.expected_duration_s or 0) * self.time_scale
        if expected > 0:
            events += [
                (
                    expected * i / 10,
                    0,
                    f"step {i * 100}: {i * 10}% of the expected run, loss {2.5 * 0.85**i:.3f}",
                )
                for i in range(1, 10)
            ]
        interval = job.checkpoint_interval_s * self.time_scale
        if interval > 0:
            limit = min(SIM_LOG_MAX_LINES, int(expected / interval) if expected > 0 else SIM_LOG_MAX_LINES)
            events += [(interval * n, 1, f"checkpoint {n} saved") for n in range(1, limit + 1)]
        elapsed = (until - start).total_seconds()
        for at, _order, text in sorted(events)[:SIM_LOG_MAX_LINES]:
            if at > elapsed:
                break
            lines.append(f"{_stamp(start + timedelta(seconds=at))} [sim] {text}")
        if end is not None and end <= now:
            why = f": {job.state_reason}" if job.state_reason else ""
            lines.append(f"{_stamp(end)} [sim] job #{job.pk} {job.state}{why}")
        return lines
