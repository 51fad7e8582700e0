"""The Slurm adapter: Rackwise's typed steps as Slurm commands, and what Slurm
says of nodes and jobs. See the README's "Slurm" section for the whole model.

Every step checks what Slurm already has before it acts (Celery delivers at
least once, and a worker may die between a Slurm command and the database
commit):

=========== ==============================================================
allocate    Rackwise's own job: ``sbatch --hold --nodelist=<chosen> ...``,
            unless a Slurm job with comment ``rackwise:<pk>:`` exists (a
            retried step), then reuse it. A job that already has a Slurm id
            (adopted, or re-placed after stop/requeue): hold it pending, then
            ``scontrol update JobId=J NodeList=.. NumNodes=.. StartTime=now``.
start       ``scontrol update StartTime=now`` + ``release``, then wait until
restart     RUNNING; already running on the intended nodes: done.
checkpoint  ``scancel --signal=USR1 --batch J``, then a grace period.
stop,       ``scontrol requeuehold J`` (RUNNING) or ``hold J`` (PENDING),
preempt,    then wait until PENDING: the job waits, held, for Rackwise to
requeue     place it again.
swap        as stop, then ``update NodeList=<old - failed + spares>
            StartTime=now``; the restart step releases it.
drain,      ``scontrol update NodeName=.. State=DRAIN|RESUME Reason=..``,
undrain     only if the node is not already so.
=========== ==============================================================

A job's log is its output file: Rackwise submits with
``--output=<jobs dir>/rackwise-<pk>-%j.out --open-mode=append`` (a requeued
job's runs follow one another in one file), and :meth:`SlurmAdapter.read_log`
reads it from ``RACKWISE_SLURM_JOBS_DIR`` (the same directory as this process
sees it). An adopted job's output is wherever its ``sbatch`` put it
(``StdOut`` of ``scontrol show job``): readable when that lies in the jobs
directory too.

The intended nodes of a job are its active allocation rows (the truth for
which GPUs it holds), read from the database; an adapter reads rows but never
writes them, and never imports ``fleet.services`` or ``fleet.tasks``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from django.conf import settings

from fleet import steps as st
from fleet.cluster.base import (
    DONE,
    NODE_DRAINING,
    NODE_FAILED,
    NODE_HEALTHY,
    WAITING,
    ClusterUnavailable,
    JobReport,
    LogChunk,
    NodeReport,
    Outcome,
    Progress,
    StepFailed,
)
from fleet.cluster.slurm_cli import (
    NODE_DRAIN_STATES,
    NODE_FAILED_STATES,
    SlurmCli,
    SlurmError,
    SlurmJob,
    job_report,
    node_flags,
    node_report,
    node_state,
    number,
    parse_show_topology,
)
from fleet.models import Job, Node
from fleet.topology import slurm as slurm_topology

if TYPE_CHECKING:
    from fleet.models import Action
    from fleet.topology import Topology

log = logging.getLogger(__name__)

COMMENT_PREFIX = "rackwise:"
REASON_PREFIX = "rackwise: "


def comment_for(job_pk: int, attempt: int = 0) -> str:
    return f"{COMMENT_PREFIX}{job_pk}:{attempt}"


def rackwise_job_of(comment: str) -> int | None:
    """The Rackwise job id in a ``rackwise:<pk>:<attempt>`` comment, else None."""
    if not comment.startswith(COMMENT_PREFIX):
        return None
    pk = comment[len(COMMENT_PREFIX) :].split(":", 1)[0]
    return int(pk) if pk.isdigit() else None


@dataclass
class SlurmAdapter:
    cli: SlurmCli
    partition: str = "gpu"
    jobs_dir: str = ""  # where job scripts are written (host path)
    jobs_dir_in_cluster: str = ""  # the same directory as Slurm's nodes see it
    checkpoint_signal: str = "USR1"
    checkpoint_grace_s: float = 5.0
    wait_s: float = 10.0  # how long a step waits for Slurm to reach a state
    poll_s: float = 0.1
    name: str = "slurm"

    @classmethod
    def from_settings(cls) -> SlurmAdapter:

        jobs_dir = settings.RACKWISE_SLURM_JOBS_DIR
        return cls(
            cli=SlurmCli(settings.RACKWISE_SLURM_BIN or None, timeout_s=settings.RACKWISE_SLURM_TIMEOUT_S),
            partition=settings.RACKWISE_SLURM_PARTITION,
            jobs_dir=jobs_dir,
            jobs_dir_in_cluster=settings.RACKWISE_SLURM_JOBS_DIR_IN_CLUSTER or jobs_dir,
            checkpoint_signal=settings.RACKWISE_SLURM_CHECKPOINT_SIGNAL,
            checkpoint_grace_s=settings.RACKWISE_SLURM_CHECKPOINT_GRACE_S,
            wait_s=settings.RACKWISE_SLURM_WAIT_S,
        )

    # --- the protocol -----------------------------------------------------------

    def perform(
        self, action: Action | None, index: int, step: st.Step, report: Progress | None = None
    ) -> Outcome:
        if isinstance(step, dict):  # a stored step (older callers)
            step = st.Step.from_dict(step)
        self.cli.ping()
        if isinstance(step, st.Drain | st.Undrain):
            hostname = step.hostname or _no_hosts(step)
            state = NODE_DRAINING if isinstance(step, st.Drain) else NODE_HEALTHY
            self.set_node_state(hostname, state, step.reason or (action and f"action #{action.pk}") or "")
            return Outcome(DONE)
        job = _job(step.job)
        handler: Callable[..., Outcome] = {
            st.Allocate: self._allocate,
            st.Start: self._start,
            st.Restart: self._start,
            st.Checkpoint: self._checkpoint,
            st.Stop: self._hold,
            st.Preempt: self._hold,
            st.Requeue: self._hold,
            st.Swap: self._swap,
        }[type(step)]
        return handler(job, step)

    def reports_fleet(self) -> bool:
        return True  # scontrol reports nodes, held jobs and blocks

    def after_step(self, action: Action | None, index: int, step: st.Step) -> None:
        return None

    def cancel(self, job: Job) -> None:
        self.cli.ping()
        found = self.find(job)
        if found is not None and not found.ended:
            self.cli.run("scancel", found.job_id)

    def set_node_state(self, hostname: str, state: str, reason: str) -> None:
        """Mirror a Rackwise node change into Slurm, only if Slurm differs:
        ``State=RESUME`` on a node that is not drained or down is an error there."""
        self.cli.ping()
        node = self.cli.node(hostname)
        if node is None:
            log.warning("node %s is not in Slurm; its %s state stays Rackwise's own", hostname, state)
            return
        flags = node_flags(node.get("state"))
        why = REASON_PREFIX + (reason or state)
        if state == NODE_DRAINING and not flags & NODE_DRAIN_STATES:
            self.cli.run("scontrol", "update", f"NodeName={hostname}", "State=DRAIN", f"Reason={why}")
        elif state == NODE_FAILED and not flags & NODE_FAILED_STATES:
            self.cli.run("scontrol", "update", f"NodeName={hostname}", "State=DOWN", f"Reason={why}")
        elif state == NODE_HEALTHY and flags & (NODE_DRAIN_STATES | NODE_FAILED_STATES):
            self.cli.run("scontrol", "update", f"NodeName={hostname}", "State=RESUME")

    def node_states(self) -> dict[str, NodeReport]:
        self.cli.ping()
        jobs_on: dict[str, list[str]] = {}
        for job in self._jobs():
            if job.state in ("RUNNING", "SUSPENDED", "CONFIGURING"):
                for host in job.nodes:
                    jobs_on.setdefault(host, []).append(job.job_id)
        reports = (node_report(item, jobs_on) for item in self.cli.nodes())
        return {r.hostname: r for r in reports if r is not None}

    def job_states(self, jobs: list[Job], *, listed_only: bool = False) -> dict[int, JobReport]:
        """Reports by Rackwise job id, from ``squeue --json``; a job squeue no
        longer lists is asked for by ``scontrol show job`` (unless
        ``listed_only``). A job Slurm has purged (ended over MinJobAge ago) is absent."""
        wanted = {str(j.external_id): j.pk for j in jobs if j.external_id}
        if not wanted:
            return {}
        self.cli.ping()
        listed = {str(item.get("job_id")): item for item in self.cli.jobs()}
        out: dict[int, JobReport] = {}
        for sid, pk in wanted.items():
            item = listed.get(sid)
            if item is None and not listed_only:
                item = self.cli.job(sid)
            if item is not None:
                out[pk] = job_report(item)
        return out

    def read_log(self, job: Job, offset: int, limit: int, *, from_end: bool = False) -> LogChunk:
        """The job's output file, read where this process sees the jobs
        directory. Slurm is asked only when the file is not where Rackwise's
        own ``--output`` puts it (an adopted job, or one not yet started)."""
        if not job.external_id:
            return LogChunk(reason="the job has no Slurm job yet: nothing has run, so there is no output")
        if not self.jobs_dir:
            return LogChunk(reason="RACKWISE_SLURM_JOBS_DIR is not set: Rackwise cannot read job output")
        path = os.path.join(self.jobs_dir, f"rackwise-{job.pk}-{job.external_id}.out")
        if not os.path.isfile(path):
            self.cli.ping()
            item = self.cli.job(job.external_id)
            if item is None:
                return LogChunk(
                    reason=f"Slurm job {job.external_id} wrote no output here, and Slurm no longer knows it"
                )
            found = SlurmJob.parse(item)
            if found.state == "PENDING" and not number(item.get("restart_cnt")):
                return LogChunk(reason=f"Slurm job {job.external_id} has not started yet: no output so far")
            path = self._host_path(str(item.get("standard_output") or ""))
            if not path:
                return LogChunk(
                    reason=f"Slurm job {job.external_id} writes its output outside RACKWISE_SLURM_JOBS_DIR "
                    "(or to no file): Rackwise cannot read it"
                )
            if not os.path.isfile(path):
                return LogChunk(reason=f"Slurm job {job.external_id} has written no output yet")
        if not _inside(path, self.jobs_dir):
            return LogChunk(reason="the job's output file leads outside RACKWISE_SLURM_JOBS_DIR: not read")
        return read_file(path, offset, limit, from_end=from_end)

    def _host_path(self, in_cluster: str) -> str:
        """A path as Slurm's nodes see it, as this process sees it; "" when it
        is not in the jobs directory."""
        inside = (self.jobs_dir_in_cluster or self.jobs_dir).rstrip("/")
        if not in_cluster or not inside:
            return ""
        rest = os.path.normpath(in_cluster)
        if not rest.startswith(inside + "/"):
            return ""
        return os.path.join(self.jobs_dir, rest[len(inside) + 1 :])

    # --- beyond the protocol: adoption and topology -----------------------------

    def adoptable_jobs(self) -> list[JobReport]:
        """Held pending jobs in the managed partition that Rackwise did not
        submit (no ``rackwise:`` comment): users' ``sbatch --hold`` jobs."""
        self.cli.ping()
        out = []
        for item in self.cli.jobs():
            job = SlurmJob.parse(item)
            partitions = str(item.get("partition") or "").split(",")
            if (
                job.state == "PENDING"
                and job.held
                and self.partition in partitions
                and rackwise_job_of(job.comment) is None
            ):
                out.append(job_report(item))
        return out

    def topology(self, *, max_gpus: int = 8) -> Topology:
        """Blocks (``scontrol show topology``) as racks and nodes with their GPUs
        and states (``scontrol show nodes --json``), as a Topology to import."""

        self.cli.ping()
        blocks = parse_show_topology(self.cli.topology())
        conf = slurm_topology.BlockConf(
            blocks=[slurm_topology.Block(name=b.name, nodes=list(b.nodes)) for b in blocks],
            filename="scontrol show topology",
        )
        if not conf.blocks:
            raise StepFailed("scontrol show topology lists no blocks (is TopologyPlugin=topology/block set?)")
        items = self.cli.nodes()
        known, skipped = slurm_topology.parse_scontrol_nodes(
            {"nodes": items}, "scontrol show nodes --json", max_gpus=max_gpus
        )
        # States as the live sync reads them (node_state): a node just resumed,
        # or not yet heard from after a slurmctld restart, keeps its state
        # rather than being failed by the import.
        live = {item.get("name"): node_state(item.get("state")) for item in items}
        known = {
            name: replace(node, state=live.get(name), reason=node.reason if live.get(name) else "")
            for name, node in known.items()
        }
        topology = slurm_topology.to_topology(conf, (known, skipped), nodes_place="scontrol show nodes")
        topology.source = "slurm-live"
        return topology

    # --- finding a job's Slurm job ----------------------------------------------

    def _jobs(self) -> list[SlurmJob]:
        return [SlurmJob.parse(item) for item in self.cli.jobs()]

    def find(self, job: Job) -> SlurmJob | None:
        """The job's Slurm job: by its external id, else (a step retried before
        the id was stored) an active Slurm job with its ``rackwise:<pk>:`` comment."""
        if job.external_id:
            item = self.cli.job(job.external_id)
            if item is not None:
                return SlurmJob.parse(item)
        mine = [j for j in self._jobs() if rackwise_job_of(j.comment) == job.pk]
        live = [j for j in mine if not j.ended]
        return max(live or mine, key=lambda j: int(j.job_id)) if mine else None

    def _get(self, job_id: str) -> SlurmJob:
        item = self.cli.job(job_id)
        if item is None:
            raise StepFailed(f"Slurm no longer knows job {job_id}")
        return SlurmJob.parse(item)

    def _wait(self, job_id: str, done: Callable[[SlurmJob], bool], what: str) -> SlurmJob | None:
        """Poll until ``done``; the last state, or None after ``wait_s``."""
        deadline = time.monotonic() + self.wait_s
        while True:
            job = self._get(job_id)
            if done(job) or job.ended:
                return job
            if time.monotonic() >= deadline:
                log.info(
                    "Slurm job %s not %s after %.1f s (%s, %s)",
                    job_id,
                    what,
                    self.wait_s,
                    job.state,
                    job.reason,
                )
                return None
            time.sleep(self.poll_s)

    # --- steps ------------------------------------------------------------------

    def _allocate(self, job: Job, step: st.Allocate) -> Outcome:
        hosts = list(step.hostnames) or _no_hosts(step)
        found = self.find(job)
        if found is None:
            _may_submit(job)
            return Outcome(DONE, external_id=self._submit(job, hosts, step.segments))
        if found.ended:
            raise StepFailed(_ended(job, found))
        if found.state == "RUNNING" and set(found.nodes) == set(hosts):
            return Outcome(DONE, external_id=found.job_id)
        self._hold_pending(found)
        self._pin(found.job_id, hosts)
        return Outcome(DONE, external_id=found.job_id)

    def _submit(self, job: Job, hosts: list[str], segments) -> str:
        spec = dict((job.cluster_spec or {}).get("slurm") or {})
        script = spec.get("script")
        if not script:
            command = spec.get("command") or f"sleep {job.expected_duration_s or 86400}"
            script = f"#!/bin/bash\n{command}\n"
        if not self.jobs_dir:
            raise StepFailed("RACKWISE_SLURM_JOBS_DIR is not set: there is nowhere to write the job script")
        os.makedirs(self.jobs_dir, exist_ok=True)
        path = os.path.join(self.jobs_dir, f"rackwise-{job.pk}.sh")
        with open(path, "w") as f:
            f.write(script)
        inside = self.jobs_dir_in_cluster or self.jobs_dir
        args = [
            "--parsable",
            "--hold",
            f"--job-name=rackwise-{job.pk}",
            f"--comment={comment_for(job.pk, job.attempt)}",
            f"--partition={spec.get('partition') or self.partition}",
            f"--nodelist={','.join(hosts)}",
            f"--nodes={len(hosts)}",
            "--requeue",
            f"--chdir={inside}",
            f"--output={inside}/rackwise-{job.pk}-%j.out",
            # A requeued job (a swap, a migration) runs again: its runs' output
            # follows one another, so a log reader's offsets stay valid.
            "--open-mode=append",
        ]
        if job.num_nodes is not None:
            args += ["--exclusive", f"--gpus-per-node={job.gpus_per_node}"]
            segment = segment_size(len(hosts), segments, _one_rack(hosts))
            if segment:
                args.append(f"--segment={segment}")
        else:
            args.append(f"--gres=gpu:{job.num_gpus}")
        if spec.get("account"):
            args.append(f"--account={spec['account']}")
        # The API's section gives minutes (time_limit_min); sbatch --time takes
        # plain minutes too, or any of its own formats (time_limit).
        if spec.get("time_limit_min"):
            args.append(f"--time={int(spec['time_limit_min'])}")
        elif spec.get("time_limit"):
            args.append(f"--time={spec['time_limit']}")
        env = spec.get("env") or {}
        if env:
            args.append("--export=ALL," + ",".join(f"{k}={v}" for k, v in env.items()))
        out = self.cli.run("sbatch", *args, f"{inside}/rackwise-{job.pk}.sh").strip()
        job_id = out.split(";", 1)[0].strip()
        if not job_id.isdigit():
            raise StepFailed(f"sbatch printed no job id: {out[:200]!r}")
        log.info("job #%s submitted to Slurm as %s on %s", job.pk, job_id, ",".join(hosts))
        return job_id

    def _pin(self, job_id: str, hosts: list[str]) -> None:
        """Put a pending job on ``hosts``, to start as soon as it is released.
        ``Requeue=1``: an adopted job may have been submitted ``--no-requeue``,
        and every later move of it is a ``requeuehold``."""
        self.cli.run(
            "scontrol", "update", f"JobId={job_id}", f"NodeList={','.join(hosts)}", f"NumNodes={len(hosts)}",
            "Requeue=1", "StartTime=now",
        )  # fmt: skip

    def _hold_pending(self, found: SlurmJob) -> SlurmJob:
        """The job pending and held: requeuehold a running job and wait until
        it is pending (``update NodeList`` is refused on a running job)."""
        if found.state == "PENDING" and not found.completing:
            if not found.held:
                self.cli.run("scontrol", "hold", found.job_id)
            return found
        if found.state in ("RUNNING", "SUSPENDED", "CONFIGURING"):
            self._requeuehold(found.job_id)
        # A requeued job is PENDING+COMPLETING while its nodes clean up; NodeList
        # can be changed once that is over.
        pending = self._wait(found.job_id, lambda j: j.state == "PENDING" and not j.completing, "pending")
        if pending is None:
            raise ClusterUnavailable(
                f"Slurm job {found.job_id} was requeued but is not pending after {self.wait_s:g} s"
            )
        if pending.ended:
            raise StepFailed(f"Slurm job {found.job_id} ended ({pending.state}) instead of requeueing")
        if not pending.held:
            self.cli.run("scontrol", "hold", found.job_id)
        return pending

    def _requeuehold(self, job_id: str) -> None:
        """``scontrol requeuehold J``. Refused with "Job is pending execution"
        while a job that just started is still being launched on its nodes
        (measured: up to about a second after RUNNING), so that one refusal
        is retried until ``wait_s``."""
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                self.cli.run("scontrol", "requeuehold", job_id)
                return
            except SlurmError as exc:
                if "pending execution" not in str(exc) or time.monotonic() >= deadline:
                    raise
            time.sleep(self.poll_s)

    def _start(self, job: Job, step: st.Start | st.Restart) -> Outcome:
        # Where Rackwise has the job (its allocation, handed in the step).
        hosts = list(step.hostnames or [])
        found = self.find(job)
        if found is None:
            # Placed without an allocate step of this adapter (the scheduler
            # allocates inline): submit now, on the job's allocation.
            if not hosts:
                raise StepFailed(f"job #{job.pk} has no Slurm job and holds no nodes to start on")
            _may_submit(job)
            found = self._get(self._submit(job, hosts, step.segments))
        if found.ended:
            raise StepFailed(_ended(job, found))
        if found.state == "RUNNING":
            if not hosts or set(found.nodes) == set(hosts):
                return Outcome(DONE, external_id=found.job_id)
            found = self._hold_pending(found)
        if hosts and set(found.required) != set(hosts):
            self._pin(found.job_id, hosts)
        else:
            self.cli.run("scontrol", "update", f"JobId={found.job_id}", "StartTime=now")
        if found.held:
            _after_revocation(found)
            self.cli.run("scontrol", "release", found.job_id)
        running = self._wait(found.job_id, lambda j: j.state == "RUNNING", "running")
        if running is None:
            return Outcome(
                WAITING,
                external_id=found.job_id,
                message=f"Slurm job {found.job_id} released, not yet running",
            )
        if running.ended:
            raise StepFailed(f"Slurm job {found.job_id} ended ({running.state}) as it started")
        return Outcome(DONE, external_id=found.job_id)

    def _checkpoint(self, job: Job, step: st.Step) -> Outcome:
        found = self.find(job)
        if found is None or found.state != "RUNNING":
            return Outcome(
                DONE,
                external_id=found.job_id if found else None,
                message="not running: nothing to checkpoint",
            )
        self.cli.run("scancel", f"--signal={self.checkpoint_signal}", "--batch", found.job_id)
        if self.checkpoint_grace_s > 0:
            time.sleep(self.checkpoint_grace_s)
        return Outcome(DONE, external_id=found.job_id)

    def _hold(self, job: Job, step: st.Step) -> Outcome:
        found = self.find(job)
        if found is None or found.ended:
            return Outcome(DONE, message="no live Slurm job to stop")
        self._hold_pending(found)
        return Outcome(DONE, external_id=found.job_id)

    def _swap(self, job: Job, step: st.Swap) -> Outcome:
        swaps = dict(step.hostname_swaps) or _no_hosts(step)
        found = self.find(job)
        if found is None or found.ended:
            raise StepFailed(f"job #{job.pk} has no live Slurm job to swap nodes in")
        old = list(step.hostnames or found.required or found.nodes)
        # Also right for a retried step whose database side is done (old already
        # holds the spares and not the failed nodes).
        new = sorted((set(old) - set(swaps)) | set(swaps.values()))
        pending = self._hold_pending(found)
        if set(pending.required) != set(new):
            self._pin(found.job_id, new)
        return Outcome(DONE, external_id=found.job_id)


def segment_size(nodes: int, segments: list | None, one_rack: bool) -> int | None:
    """``--segment`` for a job on ``nodes`` explicit nodes: the size of its
    placement's segments when they are all equal, else the whole job if it is
    in one rack, else none. Slurm refuses a segment size that does not match
    how the nodelist lies in its blocks ("Requested topology configuration is
    not available"), so an unequal split gets no ``--segment`` at all: the
    nodelist already says where every node goes."""
    sizes = {len(seg) for seg in segments or [] if seg}
    if len(sizes) == 1:
        size = sizes.pop()
        return size if nodes % size == 0 else None
    return nodes if one_rack and not sizes else None


def _may_submit(job: Job) -> None:
    """A job gets a Slurm job once: never again once it had one (a Slurm job
    that ended, or was purged, may have done the work; submitting again could
    run it twice). The cluster sync reports how it ended instead."""
    if (job.cluster_spec or {}).get("slurm", {}).get("adopted"):
        raise StepFailed(f"the adopted Slurm job {job.external_id} is gone from Slurm")
    if job.external_id:
        raise StepFailed(
            f"Slurm no longer knows job {job.external_id} of job #{job.pk}; it is not submitted twice"
        )


def _ended(job: Job, found: SlurmJob) -> str:
    return (
        f"Slurm job {found.job_id} of job #{job.pk} already ended ({found.state}); "
        "the cluster sync ends the Rackwise job"
    )


def _after_revocation(job: SlurmJob) -> None:
    """Wait, if need be, until the second after the job's last run ended.

    Killing a run revokes the job's credential on its nodes with a time in
    whole seconds, and a credential issued in that same second counts as
    revoked: measured here, a swap released within the second of the requeue
    started and died at once ("Killing non-startable batch JobId=1: Job
    credential revoked", the job FAILED). Slurm's own requeue avoids it by
    delaying the start (the ~121 s BeginTime); waiting for the next second is
    enough.

    A job requeued and pending shows an ``end_time`` far ahead (its time limit's
    end), not when the run was killed: a job that has run before
    (``restart_cnt``) waits for the next whole second instead. Its run was
    killed before now, so that second is after the revocation's (the flake of a
    node failure's swap: Slurm requeued the job at 18:10:48.2, the swap released
    it at 48.5 and the batch step was killed as revoked)."""
    now = time.time()
    ended = number(job.raw.get("end_time"))
    if ended and 0 < ended + 1 - now <= 2:
        time.sleep(ended + 1 - now + 0.02)
    elif number(job.raw.get("restart_cnt")):
        time.sleep(int(now) + 1 - now + 0.02)


def read_file(path: str, offset: int, limit: int, *, from_end: bool = False) -> LogChunk:
    """At most ``limit`` bytes of the file from ``offset`` (or its last
    ``limit`` bytes), and its size when read."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            start = max(0, size - limit) if from_end else min(max(0, offset), size)
            f.seek(start)
            # Up to the size read above: bytes written since wait for the next call.
            data = f.read(max(0, min(limit, size - start)))
    except OSError as exc:
        return LogChunk(reason=f"the job's output cannot be read: {exc.strerror or exc}")
    return LogChunk(data=data, offset=start, size=size)


def _inside(path: str, directory: str) -> bool:
    """Whether ``path``, links resolved, lies in ``directory`` (a job's
    ``--output`` or a link in the jobs directory must not lead Rackwise to
    read another file of this machine)."""
    real, base = os.path.realpath(path), os.path.realpath(directory)
    return real.startswith(base.rstrip("/") + "/")


def _job(pk: int | None) -> Job:
    job = Job.objects.filter(pk=pk).first()
    if job is None:
        raise StepFailed(f"job #{pk} no longer exists")
    return job


def _no_hosts(step: st.Step):
    """A step handed without the hostnames it acts on (the executor names
    them: ``fleet.services.execution.execute.as_handed``)."""
    raise StepFailed(f"the {step.op} step names no hosts: {step.describe()}")


def _one_rack(hosts: list[str]) -> bool:
    return Node.objects.filter(hostname__in=hosts).values("rack_id").distinct().count() <= 1
