"""The simulator's data: its configuration, each job's record, the result, and the
figures computed from the records when a replay ends (``placement/sim/simulation.py`` runs the
replay)."""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from placement.model import JobRequest
from placement.place import RACKWISE_MAX_RESERVATIONS, RESERVE_AFTER_S
from placement.queues import BF_MAX_RESERVATIONS, BF_MIN_AGE_RESERVE_S, BF_WINDOW_S
from placement.sim.tenants import TenantSetup

# slurm.conf(5) SchedulerParameters bf_max_job_test: jobs a backfill cycle looks at.
BF_MAX_JOB_TEST = 500

# Bounded slowdown's floor on run time (Feitelson, "Metrics for parallel job
# scheduling and their convergence", JSSPP 2001: tau = 10 minutes).
BSLD_TAU_S = 600.0
# Size classes of the per-size wait figures, in order (see size_class()).
SIZE_CLASSES = ("1gpu", "1node", "2-8nodes", "9-18nodes", "multirack")
# Event kinds, in the order they are handled at one instant: free first, then harm,
# then new work; a requeued job back in the queue after its relaunch delay (handled
# like an arrival); then the precursor model's (placement/sim/precursors.py): a
# signal, a flag cleared, failures drawn ahead, a false alarm.
COMPLETE, REPAIR, FAIL, ARRIVE, RELAUNCH = 0, 1, 2, 3, 4
FLAG, UNFLAG, DRAW, ALARM = 5, 6, 7, 8
# Causes of lost GPU-hours (gpu_hours_lost). Restarts of drain-before-failure's
# precautionary moves ("precautions") are reported apart, under "precursors".
LOSS_CAUSES = ("span_slowdown", "failures", "migrations")


def size_class(job: JobRequest, gpus_per_node: int, nodes_per_rack: int) -> str:
    """The job's size class: ``1gpu`` (one GPU), ``1node`` (2 GPUs up to one node's),
    ``2-8nodes``, ``9-18nodes`` (9 nodes up to one rack's), ``multirack`` (more nodes
    than a rack has). Nodes are ``ceil(num_gpus / gpus_per_node)``."""
    if job.total_gpus == 1 and job.num_nodes is None:
        return "1gpu"
    n = job.nodes_needed(gpus_per_node)
    if job.is_small(gpus_per_node) or n <= 1:
        return "1node"
    if n > nodes_per_rack:
        return "multirack"
    return "2-8nodes" if n <= 8 else "9-18nodes"


@dataclass
class SimConfig:
    racks: int = 64
    nodes_per_rack: int = 18
    gpus_per_node: int = 4
    cross_rack_slowdown: float = 0.43
    node_mtbf_hours: float = 12700.0
    repair_hours: float = 24.0
    checkpoint_minutes: float = 60.0
    restart_minutes: float = 10.0
    seed: int = 0
    samples: int = 0  # >0: record that many (time, util, queue, frag) points
    spare_nodes: int = 2  # per-rack spare policy (rackwise keeps these from big gangs)
    # rackwise's queue: "backfill" (the sched/backfill cycle of placement/queues.py
    # with rackwise placement, visited in ``rackwise_order``, reservations for the
    # first ``rackwise_max_reservations`` blocked gangs) or "greedy" (the queue
    # before issue #12: any job that fits starts, plus one look-ahead reservation
    # for a gang that waited ``reserve_after_s``, if ``lookahead``).
    rackwise_queue: str = "backfill"
    rackwise_order: str = "lxf"  # or "fifo"; lxf: largest expansion factor first
    # With tenants, after owed and overdue jobs: "entitled" (jobs that keep their
    # tenant within its fair share first, then the rest, each by fair share, then
    # rackwise_order) or "share" (by fair share alone, the order before).
    rackwise_tenant_order: str = "entitled"
    rackwise_lxf_tau_s: float = 600.0  # the expansion factor's bound on run time
    rackwise_max_reservations: int = RACKWISE_MAX_RESERVATIONS
    # Keep a gang's reservation across cycles while it is still the earliest (False:
    # planned again every cycle, as Slurm's backfill does).
    rackwise_keep_reservations: bool = True
    lookahead: bool = True
    reserve_after_s: float = RESERVE_AFTER_S
    # rackwise defragmentation (None = off): a gang blocked this long gets a defrag
    # plan (within the budget); its moves are applied as migrations.
    defrag_after_s: float | None = 3600.0
    defrag_budget_gpu_hours: float = 200.0
    check_invariants: bool = False  # validate the fleet after every instant (tests)
    # A requeued job (failure under Slurm-like recovery, or a preempted victim) may
    # start again only this long after it was stopped: the scheduler has to notice,
    # the job goes back to pending, then it is relaunched (an in-place swap pays only
    # the restart).
    requeue_delay_s: float = 120.0
    # Locality given to trace rows that carry none (None: keep the trace's default,
    # preferred). Real NVL72 training jobs are submitted as required.
    locality: str | None = "required"
    # slurm-block's sched/backfill (slurm.conf(5) SchedulerParameters defaults).
    bf_window_s: float = BF_WINDOW_S
    bf_min_age_reserve_s: float = BF_MIN_AGE_RESERVE_S
    bf_max_reservations: int = BF_MAX_RESERVATIONS
    bf_max_job_test: int = BF_MAX_JOB_TEST
    # A shared fleet (None: one tenant, no quotas, as before): tenants' quotas, fair
    # share and reclaim, per policy (placement/sim/preempt.py). Jobs carry their
    # tenant (placement/sim/tenants.py assigns them on traces without one).
    tenants: TenantSetup | None = None
    # Failure precursors (issue #31; off by default: share 0, no false alarms).
    # ``precursor_share`` of node failures are announced by a signal on their node
    # about ``precursor_lead_s`` before (each lead drawn uniformly within +-50% of
    # it); false alarms flag nodes that do not fail, ``false_alarm_per_node_day`` per
    # node and day (a Poisson stream). A flag lasts until its node fails or
    # ``precursor_clear_s`` has passed (None: the longest lead, 1.5 x
    # ``precursor_lead_s``). Signals and alarms have their own random streams, so the
    # failures are the same with or without them (placement/sim/precursors.py).
    precursor_share: float = 0.0
    precursor_lead_s: float = 3600.0
    false_alarm_per_node_day: float = 0.0
    precursor_clear_s: float | None = None
    # rackwise's reaction to a flag (False: reactive recovery only, the baseline): the
    # node takes no new work and is drained as its jobs end; a job on it that would
    # not end before the expected failure (flag + precursor_lead_s) is checkpointed
    # and moved off it at once (a same-rack swap, else a move; never a preemption).
    drain_before_failure: bool = True


def config_overrides(items: Iterable[str]) -> dict[str, Any]:
    """SimConfig fields from ``FIELD=VALUE`` strings (a benchmark's ``--set``, for
    ablations): each VALUE a Python literal (``None``, ``3600``, ``False``) or else a
    plain string (``greedy``). Raises ValueError, naming the item, for one that is not
    ``FIELD=VALUE`` with a SimConfig field."""
    fields = {f.name for f in dataclasses.fields(SimConfig)}
    out: dict[str, Any] = {}
    for item in items:
        name, _, value = item.partition("=")
        if name not in fields or not value:
            raise ValueError(f"--set {item!r}: expected FIELD=VALUE with a SimConfig field")
        try:
            out[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[name] = value
    return out


@dataclass
class JobState:
    job: JobRequest
    submit: float
    duration: float
    order: tuple[float, float, int]
    remaining: float = 0.0
    first_start: float | None = None
    end: float | None = None
    run_start: float = 0.0
    penalty: float = 0.0
    speed: float = 1.0
    gpus: int = 0
    restarts: int = 0
    version: int = 0
    nodes: int = 0
    always_local: bool = True
    excess: int = 0
    ran: bool = False
    need: int = 1  # fewest racks the gang could run on (segments kept whole)
    restart_cause: str = "failures"  # what the next restart penalty is charged to


@dataclass
class SimResult:
    policy: str
    metrics: dict[str, Any]
    series: list[tuple[float, float, int, float]] = field(default_factory=list)
    # The replay's decisions in one hash (:func:`fingerprint`): two runs that
    # started, restarted and ended every job at the same instants agree.
    fingerprint: str = ""


def fingerprint(jobs: dict[str, JobState]) -> str:
    """A short hash of when each job first started, how often it restarted and
    when it ended, in job id order: equal for replays that decided alike."""
    digest = hashlib.sha256()
    for job_id in sorted(jobs):
        state = jobs[job_id]
        digest.update(f"{job_id},{state.first_start!r},{state.restarts},{state.end!r};".encode())
    return digest.hexdigest()[:16]


class Replay(Protocol):
    """What :func:`metrics` reads of a finished replay (a ``Simulation``)."""

    policy: str
    cfg: SimConfig
    jobs: dict[str, JobState]
    counts: dict[str, int]
    total_gpus: int
    held_gpu_s: float
    useful_gpu_s: float
    migration_gpu_s: float
    lost_gpu_s: dict[str, float]


def metrics(run: Replay, first_submit: float, wall: float) -> dict[str, Any]:
    """The simulator's figures (its JSON keys) for a finished replay."""
    done = [s for s in run.jobs.values() if s.end is not None]
    started = [s for s in run.jobs.values() if s.first_start is not None]
    makespan = max((s.end for s in done if s.end is not None), default=first_submit)
    makespan -= first_submit
    waits = sorted(s.first_start - s.submit for s in started if s.first_start is not None)
    multi = [s for s in started if s.nodes > 0]
    local_pool = [s for s in multi if s.need == 1]
    cfg = run.cfg

    def pct(p: float, xs: list[float] | None = None) -> float:
        xs = waits if xs is None else xs
        if not xs:
            return 0.0
        return xs[min(len(xs) - 1, max(0, math.ceil(p * len(xs)) - 1))]

    # Wait weighted by the GPU-hours each started job asked for (GPUs x duration).
    weight = sum(s.job.total_gpus * s.duration for s in started)
    weighted_wait = (
        sum(
            (s.first_start - s.submit) * s.job.total_gpus * s.duration
            for s in started
            if s.first_start is not None
        )
        / weight
        if weight
        else 0.0
    )
    bsld = [max(1.0, (s.end - s.submit) / max(s.duration, BSLD_TAU_S)) for s in done if s.end is not None]
    by_size: dict[str, list[float]] = {c: [] for c in SIZE_CLASSES}
    # A started job's wait against its run (bounded below by BSLD_TAU_S), per class:
    # how long a job waited for the length of its run, the starvation figure.
    slowdown_by_size: dict[str, list[float]] = {c: [] for c in SIZE_CLASSES}
    for s in started:
        if s.first_start is not None:
            c = size_class(s.job, cfg.gpus_per_node, cfg.nodes_per_rack)
            wait = s.first_start - s.submit
            by_size[c].append(wait)
            slowdown_by_size[c].append(max(1.0, (wait + s.duration) / max(s.duration, BSLD_TAU_S)))
    for xs in by_size.values():
        xs.sort()

    return {
        "policy": run.policy,
        "jobs": len(run.jobs),
        "completed": len(done),
        "rejected": run.counts["rejected"],
        "gpu_utilization": _r(run.held_gpu_s / (run.total_gpus * makespan) if makespan > 0 else 0.0),
        "rack_local_fraction": _r(
            sum(s.always_local for s in local_pool) / len(local_pool) if local_pool else 1.0
        ),
        "excess_racks_mean": _r(sum(s.excess for s in multi) / len(multi) if multi else 0.0),
        "mean_wait_s": _r(sum(waits) / len(waits) if waits else 0.0),
        "p50_wait_s": _r(pct(0.5)),
        "p95_wait_s": _r(pct(0.95)),
        "mean_jct_s": _r(
            sum(s.end - s.submit for s in done if s.end is not None) / len(done) if done else 0.0
        ),
        "makespan_s": _r(makespan),
        "goodput": _r(run.useful_gpu_s / run.held_gpu_s if run.held_gpu_s else 0.0),
        "failures": run.counts["failures"],
        "in_place_recoveries": run.counts["in_place_recoveries"],
        "requeues": run.counts["requeues"],
        "migrations": run.counts["migrations"],
        "migration_gpu_hours": _r(run.migration_gpu_s / 3600),
        "gpu_hour_weighted_wait_s": _r(weighted_wait),
        "bounded_slowdown_mean": _r(sum(bsld) / len(bsld) if bsld else 0.0),
        "p95_wait_s_by_size": {c: _r(pct(0.95, xs)) for c, xs in by_size.items()},
        "max_wait_s_by_size": {c: _r(xs[-1] if xs else 0.0) for c, xs in by_size.items()},
        "p99_wait_s_by_size": {c: _r(pct(0.99, xs)) for c, xs in by_size.items()},
        "max_slowdown_by_size": {c: _r(max(xs, default=1.0)) for c, xs in slowdown_by_size.items()},
        "gpu_hours_lost": {c: _r(run.lost_gpu_s[c] / 3600) for c in LOSS_CAUSES},
        "useful_utilization": _r(run.useful_gpu_s / (run.total_gpus * makespan) if makespan > 0 else 0.0),
        "wall_s": round(wall, 3),
    }


def _r(x: float) -> float:
    return round(float(x), 6)
