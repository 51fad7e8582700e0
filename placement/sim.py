"""The discrete-event trace replay behind ``python -m placement.simulate``.

Events: arrivals, completions, node failures, node repairs. After every batch of
events at one instant, a queue pass starts what may start. Failures follow one
seeded sequence (exponential gaps, MTBF per node, node picked uniformly), the same
for every policy, so policies face identical faults while the run lasts.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from placement.defrag import defragment
from placement.fragmentation import fragmentation
from placement.model import FAILED, HEALTHY, Allocation, Fleet, JobRequest
from placement.place import (
    RACKWISE_MAX_RESERVATIONS,
    RESERVE_AFTER_S,
    can_ever_fit,
    place,
    reservation,
    shape_key,
)
from placement.policies import POLICIES
from placement.policies.common import min_racks
from placement.policies.rackwise import idle_room, rack_room
from placement.policies.slurm_block import block_room
from placement.queues import (
    BF_MAX_RESERVATIONS,
    BF_MIN_AGE_RESERVE_S,
    BF_WINDOW_S,
    Backfill,
    NodeEnds,
    expansion_factor,
)
from placement.recover import apply_recovery, recover
from placement.trace import TraceJob
from placement.validate import validate, validate_indexes

POLICY_NAMES = ("rackwise", "first-fit", "random", "slurm-block", "slurm-block-greedy",
                "kueue-tas")
# Policies whose failed jobs are requeued whole (Slurm --requeue, and the blind ones).
REQUEUE_ON_FAILURE = ("first-fit", "random", "slurm-block", "slurm-block-greedy")
# slurm.conf(5) SchedulerParameters bf_max_job_test: jobs a backfill cycle looks at.
BF_MAX_JOB_TEST = 500

# Event kinds, in the order they are handled at one instant: free first, then harm,
# then new work.
COMPLETE, REPAIR, FAIL, ARRIVE = 0, 1, 2, 3
# A requeued job back in the queue after its relaunch delay (handled like an arrival).
RELAUNCH = 4

# Bounded slowdown's floor on run time (Feitelson, "Metrics for parallel job
# scheduling and their convergence", JSSPP 2001: tau = 10 minutes).
BSLD_TAU_S = 600.0
# Size classes of the per-size wait figures, in order (see size_class()).
SIZE_CLASSES = ("1gpu", "1node", "2-8nodes", "9-18nodes", "multirack")
# Causes of lost GPU-hours (gpu_hours_lost).
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
    rackwise_lxf_tau_s: float = 600.0  # the expansion factor's bound on run time
    rackwise_max_reservations: int = RACKWISE_MAX_RESERVATIONS
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


Progress = Callable[[str, float, int, int], None]


class Simulation:
    """One policy over one trace. Call :meth:`run`."""

    def __init__(self, trace: Sequence[TraceJob], policy: str, cfg: SimConfig,
                 progress: Progress | None = None) -> None:
        self.cfg = cfg
        self.policy = policy
        self.fleet = Fleet.uniform(cfg.racks, cfg.nodes_per_rack, cfg.gpus_per_node,
                                   spare_nodes=cfg.spare_nodes)
        self.node_ids = list(self.fleet.nodes)
        self.total_gpus = self.fleet.total_gpus
        self.rng = random.Random(cfg.seed + 1)  # policy choices (random policy)
        self.fail_rng = random.Random(cfg.seed)  # the failure sequence
        self.progress = progress
        self.heap: list[tuple[float, int, int, str]] = []
        self.seq = 0
        self.jobs: dict[str, JobState] = {}
        self.trace = trace
        # Queue: jobs grouped by shape; within a group by (priority, submit, seq).
        self.groups: dict[tuple[Any, ...], list[JobState]] = {}
        self.blocked: set[tuple[Any, ...]] = set()
        self.reserved: frozenset[str] = frozenset()
        self.reserved_until: float | None = None
        self.reserved_for: str | None = None
        self.queued = 0
        self.running: set[str] = set()
        self.unfinished = 0
        self.repairs_pending = 0
        self.arrivals_left = 0
        self.held_gpu_s = 0.0
        self.useful_gpu_s = 0.0
        self.counts = {"failures": 0, "in_place_recoveries": 0, "requeues": 0,
                       "migrations": 0, "rejected": 0}
        self.migration_gpu_s = 0.0
        self.lost_gpu_s = dict.fromkeys(LOSS_CAUSES, 0.0)
        self.relaunches_pending = 0
        self.series: list[tuple[float, float, int, float]] = []
        self.held_now = 0
        self.done = 0
        self.defrag_tried: dict[str, float] = {}
        # Queue-discipline state, dropped whenever capacity comes back (_freed).
        self.bf: Backfill | None = None  # slurm-block: this cycle's reservations
        self.node_ends: NodeEnds | None = None  # when nodes free up, kept across cycles
        self.bf_last: tuple[float, float, int] | None = None  # last job it looked at
        self.fresh: list[JobState] = []  # queued since the last pass
        self.fifo_blocked: str | None = None  # kueue-tas: the head that does not fit
        # Backfill's room tests by (shape, rack group): they read only the shape and
        # the racks' sizes, which never change.
        self.room_tests: dict[tuple[Any, ...], Callable[[dict[str, int]], bool]] = {}

    # -- events -------------------------------------------------------------------------

    def push(self, t: float, kind: int, key: str) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, key))

    def run(self) -> SimResult:
        wall0 = time.perf_counter()
        cfg = self.cfg
        first_submit = min((t.submit for t in self.trace), default=0.0)
        for i, tj in enumerate(self.trace):
            job = tj.job
            if cfg.locality is not None and not tj.locality_given:
                job = dataclasses.replace(job, locality=cfg.locality)
            # Queue order: priority, then submit time, then trace order. This is
            # Slurm's with priority/multifactor's default weights (slurm.conf(5):
            # PriorityWeightAge and PriorityWeightJobSize default to 0, so only the
            # trace's priority differs; ties go by submit time, then job id:
            # priority_multifactor.html) and Kueue's (priority, then creation time).
            st = JobState(job, tj.submit, tj.duration, (-job.priority, tj.submit, i),
                          remaining=tj.duration)
            self.jobs[tj.job.id] = st
            self.push(tj.submit, ARRIVE, tj.job.id)
        self.arrivals_left = len(self.trace)
        self.unfinished = len(self.trace)
        fail_gap = (cfg.node_mtbf_hours * 3600 / len(self.node_ids)
                    if cfg.node_mtbf_hours > 0 and self.node_ids else 0.0)
        if fail_gap and self.trace:
            self.push(first_submit + self.fail_rng.expovariate(1 / fail_gap), FAIL, "")
        last_t = first_submit
        span = max((t.submit for t in self.trace), default=0.0) - first_submit
        sample_dt = (span * 1.5 / cfg.samples) if cfg.samples else math.inf
        next_sample = first_submit
        shapes_seen: dict[int, float] = {}
        last_progress = 0.0
        while self.heap:
            t = self.heap[0][0]
            while self.heap and self.heap[0][0] == t:
                _, kind, _, key = heapq.heappop(self.heap)
                if kind == ARRIVE:
                    self._arrive(t, key)
                    g = self.jobs[key].job.total_gpus
                    shapes_seen[g] = shapes_seen.get(g, 0) + 1
                elif kind == COMPLETE:
                    self._complete(t, key)
                elif kind == FAIL:
                    self._fail(t)
                    if self.unfinished > 0:
                        self.push(t + self.fail_rng.expovariate(1 / fail_gap), FAIL, "")
                elif kind == RELAUNCH:
                    self.relaunches_pending -= 1
                    self._enqueue(self.jobs[key])
                elif kind == REPAIR:
                    self.fleet.set_health(key, HEALTHY)
                    self.repairs_pending -= 1
                    self._freed()
            self._pass(t)
            if self.policy == "rackwise" and cfg.defrag_after_s is not None:
                self._defrag(t)
            if cfg.check_invariants:
                self._check(t)
            last_t = max(last_t, t)
            if (self.queued and not self.running and not self.arrivals_left
                    and not self.repairs_pending and not self.relaunches_pending):
                self._reject_stuck()
            if t >= next_sample:
                frag = fragmentation(self.fleet, shapes_seen or None).fraction
                self.series.append((t, self.held_now / self.total_gpus, self.queued, frag))
                next_sample = t + sample_dt
            if self.progress and time.perf_counter() - last_progress > 0.2:
                last_progress = time.perf_counter()
                self.progress(self.policy, t - first_submit, self.done, len(self.trace))
            if self.unfinished == 0:
                break
        return SimResult(self.policy, self._metrics(first_submit, time.perf_counter() - wall0),
                         self.series)

    # -- queue --------------------------------------------------------------------------

    def _enqueue(self, st: JobState) -> None:
        group = self.groups.setdefault(shape_key(st.job), [])
        # Keep the group sorted by order; requeued jobs go back to their place.
        lo, hi = 0, len(group)
        while lo < hi:
            mid = (lo + hi) // 2
            if group[mid].order < st.order:
                lo = mid + 1
            else:
                hi = mid
        group.insert(lo, st)
        self.queued += 1
        self.fresh.append(st)

    def _freed(self) -> None:
        """Capacity came back: every shape may fit again; reservations are redone."""
        self.blocked.clear()
        self.reserved = frozenset()
        self.reserved_until = None
        self.reserved_for = None
        self.bf = None
        self.fifo_blocked = None

    def _pass(self, now: float) -> None:
        if self.policy == "slurm-block" or (self.policy == "rackwise"
                                            and self.cfg.rackwise_queue == "backfill"):
            self._pass_backfill(now)
        elif self.policy == "kueue-tas":
            self._pass_strict_fifo(now)
        else:
            self._pass_greedy(now)
        self.fresh.clear()

    def _in_order(self, limit: int) -> list[JobState]:
        """The first ``limit`` queued jobs in queue order (groups are kept sorted)."""
        out: list[JobState] = []
        for st in heapq.merge(*(g for g in self.groups.values() if g),
                              key=lambda s: s.order):
            out.append(st)
            if len(out) >= limit:
                break
        return out

    def _take(self, st: JobState) -> None:
        group = self.groups[shape_key(st.job)]
        group.remove(st)
        self.queued -= 1

    def _expected_run(self, st: JobState) -> float:
        # What the scheduler expects this run to take (the simulator knows the
        # remaining work; Slurm would use the job's time limit).
        return st.remaining + (self.cfg.restart_minutes * 60 if st.restarts else 0.0)

    def _pass_backfill(self, now: float) -> None:
        """slurm-block: priority order with sched/backfill; rackwise: the same cycle in
        expansion-factor order with rackwise placement (placement/queues.py)."""
        cfg = self.cfg
        rackwise = self.policy == "rackwise"
        age = 0.0 if rackwise else cfg.bf_min_age_reserve_s
        lxf = rackwise and cfg.rackwise_order == "lxf"
        last = self.bf_last
        if (self.bf is not None and last is not None
                and not age  # else ageing alone changes the plan
                and all((st.submit == now and st.order[0] >= last[0]) if lxf
                        else st.order > last for st in self.fresh)):
            # Nothing came back since the last cycle: its reservations still hold and
            # the jobs it looked at still cannot start; only new arrivals are new, and
            # they come last in the queue's order (by expansion factor, a job that has
            # not waited has the lowest), so they are tried against the same holds
            # (only while the cycle's bf_max_job_test bound would reach them).
            todo = (sorted(self.fresh, key=lambda s: s.order)
                    if self.queued - len(self.fresh) < cfg.bf_max_job_test else [])
            self.bf.now = now
            self.bf.ctx.now = now
        else:
            self.bf_last = None
            if self.node_ends is None:
                self.node_ends = NodeEnds(self.fleet)
            self.bf = Backfill(self.fleet, now, POLICIES[self.policy], self.policy,
                               window_s=cfg.bf_window_s,
                               min_age_reserve_s=age,
                               max_reservations=(cfg.rackwise_max_reservations if rackwise
                                                 else cfg.bf_max_reservations),
                               room=self._room, ends=self.node_ends)
            if lxf:
                tau = cfg.rackwise_lxf_tau_s
                todo = sorted((st for g in self.groups.values() for st in g),
                              key=lambda st: (st.order[0], -expansion_factor(
                                  now - st.submit, self._expected_run(st), tau), st.order))
                del todo[cfg.bf_max_job_test:]
            else:
                todo = self._in_order(cfg.bf_max_job_test)
        bf = self.bf
        fleet = self.fleet
        gpn = cfg.gpus_per_node
        idle_total = fleet.idle_total
        max_partial = max((f for f, s in fleet.partial.items() if s), default=0)
        cannot: dict[tuple[Any, ...], float] = {}  # shape -> shortest run that failed
        for st in todo:
            if st.end is not None or st.job.id in self.running:
                continue
            self.bf_last = st.order if self.bf_last is None else max(self.bf_last, st.order)
            job = st.job
            key = shape_key(job)
            run = self._expected_run(st)
            if run < cannot.get(key, math.inf):
                # Cheap necessary conditions before a full placement decision.
                if job.is_small(gpn):
                    hopeless = not idle_total and max_partial < job.num_gpus
                else:
                    hopeless = job.nodes_needed(gpn) > idle_total or (
                        rackwise and not idle_room(fleet, job, bf.ctx))
                plan = None if hopeless else bf.try_start(job, run)
                if plan is not None and plan.placed and self._spans(job, len(plan.racks)):
                    # Spread over more racks than it needs, it runs slower: it must
                    # not run into a reservation at its real speed either.
                    slow = run / (1 - cfg.cross_rack_slowdown)
                    if bf.held_nodes(now, now + slow) & set(plan.nodes):
                        plan = None
                if plan is not None and plan.placed:
                    self._take(st)
                    self._start(now, st, plan.allocation(job))
                    bf.started(job.id)
                    idle_total = fleet.idle_total
                    max_partial = max((f for f, s in fleet.partial.items() if s), default=0)
                    continue
                # Around no hold it fails whatever it runs for: skip its shape.
                cannot[key] = run if bf.holds else -math.inf
            if self.policy != "rackwise" or not job.is_small(gpn):
                # rackwise reserves for gangs only: a single-node job fits on any
                # node, and its rising expansion factor moves it up the queue.
                bf.reserve_later(job, run, st.submit, key)

    def _room(self, job: JobRequest, racks: list[Any]) -> Callable[[dict[str, int]], bool]:
        key = (shape_key(job), id(racks))
        test = self.room_tests.get(key)
        if test is None:
            room = rack_room if self.policy == "rackwise" else block_room
            test = self.room_tests[key] = room(job, racks)
        return test

    def _spans(self, job: JobRequest, racks_used: int) -> bool:
        gpn = self.cfg.gpus_per_node
        return not job.is_small(gpn) and racks_used > min_racks(
            job.nodes_needed(gpn), self.cfg.nodes_per_rack, job.segment_nodes)

    def _pass_strict_fifo(self, now: float) -> None:
        """kueue-tas: Kueue's StrictFIFO ClusterQueue. Workloads go by priority, then
        creation time; a head that cannot be admitted blocks every workload behind
        it, even ones that would fit (kueue.sigs.k8s.io, Cluster Queue, "Queueing
        strategy")."""
        while self.queued:
            heads = [g[0] for g in self.groups.values() if g]
            st = min(heads, key=lambda s: s.order)
            if self.fifo_blocked == st.job.id:
                return  # nothing came back since it last failed
            plan = place(self.fleet, st.job, self.policy, rng=self.rng, now=now)
            if not plan.placed:
                self.fifo_blocked = st.job.id
                return
            self._take(st)
            self._start(now, st, plan.allocation(st.job))

    def _pass_greedy(self, now: float) -> None:
        """Best-effort FIFO: any job that fits starts (first-fit, random,
        slurm-block-greedy; rackwise adds its look-ahead reservation)."""
        heap = [(g[0].order, k) for k, g in self.groups.items() if g and k not in self.blocked]
        if not heap:
            return
        heapq.heapify(heap)
        fleet = self.fleet
        idle_total = fleet.idle_total
        max_partial = max((f for f, s in fleet.partial.items() if s), default=0)
        gpn = self.cfg.gpus_per_node
        while heap:
            _, key = heapq.heappop(heap)
            group = self.groups[key]
            st = group[0]
            job = st.job
            small = job.is_small(gpn)
            # Cheap necessary conditions before a full placement decision.
            if small and not idle_total and max_partial < job.num_gpus:
                self.blocked.add(key)
                continue
            if not small and job.nodes_needed(gpn) > idle_total:
                self.blocked.add(key)
                self._maybe_reserve(job, now)
                continue
            plan = place(fleet, job, self.policy, rng=self.rng, reserved=self.reserved,
                         reserved_until=self.reserved_until, now=now)
            if not plan.placed:
                self.blocked.add(key)
                self._maybe_reserve(job, now)
                continue
            group.pop(0)
            self.queued -= 1
            released = self.reserved_for == job.id
            if released:
                self.reserved, self.reserved_for = frozenset(), None
                self.reserved_until = None
            self._start(now, st, plan.allocation(job))
            if released:
                # Shapes blocked only by the reservation may fit now: pass again.
                self.blocked.clear()
                self._pass_greedy(now)
                return
            idle_total = fleet.idle_total
            max_partial = max((f for f, s in fleet.partial.items() if s), default=0)
            if group:
                heapq.heappush(heap, (group[0].order, key))

    def _check(self, t: float) -> None:
        # Jobs on a node that failed this instant were recovered already, so the
        # whole fleet must be clean; blind baselines cannot honour topology rules.
        bad = validate(self.fleet, topology=self.policy not in ("first-fit", "random"))
        bad += validate_indexes(self.fleet)
        if self.node_ends is not None:
            # The node ends kept across backfill cycles equal ones built afresh.
            kept = self.node_ends
            kept.refresh()
            fresh = NodeEnds(self.fleet, track=False)
            if (kept.free_at, kept.ends, kept.rack_ends) != (fresh.free_at, fresh.ends,
                                                             fresh.rack_ends):
                bad.append("backfill node ends drifted from the fleet")
            elif ({n: sorted(j) for n, j in kept.node_jobs.items()}
                  != {n: sorted(j) for n, j in fresh.node_jobs.items()}):
                bad.append("backfill node jobs drifted from the fleet")
        if bad:
            raise AssertionError(f"t={t}: {bad[:3]}")

    def _defrag(self, now: float) -> None:
        """Plan and apply moves for the longest-blocked gang, at most once per
        ``defrag_after_s`` per job (planning is not free)."""
        cfg = self.cfg
        assert cfg.defrag_after_s is not None
        heads = [g[0] for g in self.groups.values() if g]
        blocked = sorted((st for st in heads if not st.job.is_small(cfg.gpus_per_node)
                          and now - st.submit >= cfg.defrag_after_s
                          and now - self.defrag_tried.get(st.job.id, -math.inf)
                          >= cfg.defrag_after_s), key=lambda st: st.order)
        if not blocked:
            return
        st = blocked[0]
        self.defrag_tried[st.job.id] = now
        plan = defragment(self.fleet, [st.job], budget_gpu_hours=cfg.defrag_budget_gpu_hours,
                          restart_minutes=cfg.restart_minutes, now=now, figures=False)
        if st.job.id not in plan.jobs_made_placeable:
            return
        for move in plan.moves:
            mst = self.jobs[move.job_id]
            lost = self._interrupt(now, mst, cause="migrations")
            self.fleet.release(move.job_id)
            alloc = Allocation(mst.job, dict(move.to_nodes), [list(x) for x in move.to_segments])
            self.fleet.allocate(alloc)
            self.counts["migrations"] += 1
            self.migration_gpu_s += lost + alloc.gpus * cfg.restart_minutes * 60
            self._begin_run(now, mst, alloc)
        self._freed()
        self._pass(now)

    def _maybe_reserve(self, job: JobRequest, now: float) -> None:
        # rackwise look-ahead: the first blocked gang holds the racks nearest to fitting it.
        if (self.policy != "rackwise" or not self.cfg.lookahead
                or self.reserved_for is not None):
            return
        if job.is_small(self.cfg.gpus_per_node):
            return
        if now - (job.submit_time or 0.0) < self.cfg.reserve_after_s:
            return
        self.reserved, self.reserved_until = reservation(self.fleet, job, now)
        self.reserved_for = job.id if self.reserved else None

    def _reject_stuck(self) -> None:
        for group in self.groups.values():
            for st in group:
                self.counts["rejected"] += 1
                self.unfinished -= 1
                st.end = None
            group.clear()
        self.queued = 0

    # -- job lifecycle -------------------------------------------------------------------

    def _arrive(self, t: float, jid: str) -> None:
        st = self.jobs[jid]
        self.arrivals_left -= 1
        ok, _ = can_ever_fit(self.fleet, st.job)
        if not ok:
            self.counts["rejected"] += 1
            self.unfinished -= 1
            return
        self._enqueue(st)

    def _start(self, t: float, st: JobState, alloc: Allocation) -> None:
        self.fleet.allocate(alloc)
        self._begin_run(t, st, alloc)

    def _begin_run(self, t: float, st: JobState, alloc: Allocation) -> None:
        cfg = self.cfg
        job = st.job
        if st.first_start is None:
            st.first_start = t
        st.run_start = t
        st.penalty = cfg.restart_minutes * 60 if st.restarts else 0.0
        st.gpus = alloc.gpus
        racks_used = len(self.fleet.racks_of(alloc))
        gpn = cfg.gpus_per_node
        if not job.is_small(gpn):
            n = job.nodes_needed(gpn)
            st.nodes = n
            # Segments stay whole, so a segmented gang may need more racks than
            # ceil(nodes / rack) (36 nodes in segments of 16: 3 racks, not 2).
            need = max(1, min_racks(n, cfg.nodes_per_rack, job.segment_nodes))
            st.need = need
            st.excess = max(st.excess, racks_used - need)
            if need == 1 and racks_used > 1:
                st.always_local = False
            st.speed = 1.0 - cfg.cross_rack_slowdown if racks_used > need else 1.0
        else:
            st.speed = 1.0
        st.ran = True
        st.version += 1
        self.running.add(job.id)
        self.held_now += st.gpus
        end = t + st.penalty + st.remaining / st.speed
        alloc.expected_end = end
        alloc.started_at = t + st.penalty
        self.push(end, COMPLETE, f"{job.id}\x00{st.version}")

    def _complete(self, t: float, key: str) -> None:
        jid, version = key.split("\x00")
        st = self.jobs[jid]
        if int(version) != st.version or jid not in self.running:
            return  # superseded by an interruption
        self.held_gpu_s += st.gpus * (t - st.run_start)
        self._charge(st, t - st.run_start, None)
        self.useful_gpu_s += st.job.total_gpus * st.duration
        self.held_now -= st.gpus
        self.running.discard(jid)
        self.fleet.release(jid)
        st.end = t
        st.remaining = 0.0
        self.unfinished -= 1
        self.done += 1
        self._freed()

    def _charge(self, st: JobState, elapsed: float, saved: float | None,
                cause: str = "failures") -> None:
        """Split a run's held GPU-seconds into losses: the restart penalty goes to what
        caused the restart, work since the last checkpoint (``saved`` of the
        productive time kept; None: all of it, the job completed) to ``cause``, and
        the kept work's share lost to running slowed over extra racks to
        ``span_slowdown``."""
        g = st.gpus
        pen = min(elapsed, st.penalty)
        productive = max(0.0, elapsed - st.penalty)
        kept = productive if saved is None else saved
        lost = self.lost_gpu_s
        lost[st.restart_cause] += g * pen
        lost[cause] += g * (productive - kept)
        lost["span_slowdown"] += g * kept * (1.0 - st.speed)

    def _interrupt(self, t: float, st: JobState, cause: str = "failures") -> float:
        """Stop the current run: bank the work up to the last checkpoint.

        Returns the GPU-seconds lost (work since the checkpoint plus restart time)."""
        ckpt = self.cfg.checkpoint_minutes * 60
        elapsed = t - st.run_start
        productive = max(0.0, elapsed - st.penalty)
        saved = math.floor(productive / ckpt) * ckpt if ckpt > 0 else productive
        st.remaining = max(0.0, st.remaining - saved * st.speed)
        self._charge(st, elapsed, saved, cause)
        st.restart_cause = cause
        self.held_gpu_s += st.gpus * elapsed
        self.held_now -= st.gpus
        self.running.discard(st.job.id)
        st.restarts += 1
        st.version += 1
        return st.gpus * (productive - saved + st.penalty)

    def _requeue(self, t: float, st: JobState) -> None:
        self._interrupt(t, st)
        self.fleet.release(st.job.id)
        self.counts["requeues"] += 1
        # Back in the queue at its old place (order keeps its submit time), but
        # only after the relaunch delay.
        if self.cfg.requeue_delay_s > 0:
            self.relaunches_pending += 1
            self.push(t + self.cfg.requeue_delay_s, RELAUNCH, st.job.id)
        else:
            self._enqueue(st)
        self._freed()

    def _fail(self, t: float) -> None:
        nid = self.node_ids[self.fail_rng.randrange(len(self.node_ids))]
        node = self.fleet.nodes[nid]
        if node.health == FAILED:
            return
        self.counts["failures"] += 1
        hit = list(node.jobs)
        self.fleet.set_health(nid, FAILED)
        self.bf = None  # a reservation may hold the node that just failed
        self.repairs_pending += 1
        self.push(t + self.cfg.repair_hours * 3600, REPAIR, nid)
        for jid in hit:
            if jid not in self.running:
                continue
            self._recover(t, self.jobs[jid], nid)

    def _recover(self, t: float, st: JobState, nid: str) -> None:
        jid = st.job.id
        if self.policy in REQUEUE_ON_FAILURE:
            self._requeue(t, st)  # Slurm --requeue: the whole job goes back to the queue
            return
        if self.policy == "kueue-tas":
            plan = recover(self.fleet, jid, [nid], policy="kueue-tas", now=t)
            if plan.action != "swap":
                self._requeue(t, st)
                return
        else:
            plan = recover(self.fleet, jid, [nid], policy="rackwise",
                           restart_minutes=self.cfg.restart_minutes, now=t)
        if plan.action == "requeue":
            self._requeue(t, st)
            return
        for vid in plan.preempted:
            self._requeue(t, self.jobs[vid])
        self._interrupt(t, st)
        alloc = apply_recovery(self.fleet, plan)
        if alloc is None:  # pragma: no cover - only requeue returns None
            self._enqueue(st)
            return
        if plan.action == "move":
            self.counts["migrations"] += 1
            self.migration_gpu_s += alloc.gpus * self.cfg.restart_minutes * 60
        else:
            self.counts["in_place_recoveries"] += 1
        self._freed()
        self._begin_run(t, st, alloc)

    # -- results ------------------------------------------------------------------------

    def _metrics(self, first_submit: float, wall: float) -> dict[str, Any]:
        done = [s for s in self.jobs.values() if s.end is not None]
        started = [s for s in self.jobs.values() if s.first_start is not None]
        makespan = max((s.end for s in done if s.end is not None), default=first_submit)
        makespan -= first_submit
        waits = sorted(s.first_start - s.submit for s in started if s.first_start is not None)
        multi = [s for s in started if s.nodes > 0]
        local_pool = [s for s in multi if s.need == 1]
        cfg = self.cfg

        def pct(p: float, xs: list[float] | None = None) -> float:
            xs = waits if xs is None else xs
            if not xs:
                return 0.0
            return xs[min(len(xs) - 1, max(0, math.ceil(p * len(xs)) - 1))]

        # Wait weighted by the GPU-hours each started job asked for (GPUs x duration).
        weight = sum(s.job.total_gpus * s.duration for s in started)
        weighted_wait = (sum((s.first_start - s.submit) * s.job.total_gpus * s.duration
                             for s in started if s.first_start is not None) / weight
                         if weight else 0.0)
        bsld = [max(1.0, (s.end - s.submit) / max(s.duration, BSLD_TAU_S))
                for s in done if s.end is not None]
        by_size: dict[str, list[float]] = {c: [] for c in SIZE_CLASSES}
        for s in started:
            if s.first_start is not None:
                c = size_class(s.job, cfg.gpus_per_node, cfg.nodes_per_rack)
                by_size[c].append(s.first_start - s.submit)
        for xs in by_size.values():
            xs.sort()

        return {
            "policy": self.policy,
            "jobs": len(self.jobs),
            "completed": len(done),
            "rejected": self.counts["rejected"],
            "gpu_utilization": _r(self.held_gpu_s / (self.total_gpus * makespan)
                                  if makespan > 0 else 0.0),
            "rack_local_fraction": _r(sum(s.always_local for s in local_pool) / len(local_pool)
                                      if local_pool else 1.0),
            "excess_racks_mean": _r(sum(s.excess for s in multi) / len(multi) if multi else 0.0),
            "mean_wait_s": _r(sum(waits) / len(waits) if waits else 0.0),
            "p50_wait_s": _r(pct(0.5)),
            "p95_wait_s": _r(pct(0.95)),
            "mean_jct_s": _r(sum(s.end - s.submit for s in done if s.end is not None) / len(done)
                             if done else 0.0),
            "makespan_s": _r(makespan),
            "goodput": _r(self.useful_gpu_s / self.held_gpu_s if self.held_gpu_s else 0.0),
            "failures": self.counts["failures"],
            "in_place_recoveries": self.counts["in_place_recoveries"],
            "requeues": self.counts["requeues"],
            "migrations": self.counts["migrations"],
            "migration_gpu_hours": _r(self.migration_gpu_s / 3600),
            "gpu_hour_weighted_wait_s": _r(weighted_wait),
            "bounded_slowdown_mean": _r(sum(bsld) / len(bsld) if bsld else 0.0),
            "p95_wait_s_by_size": {c: _r(pct(0.95, xs)) for c, xs in by_size.items()},
            "max_wait_s_by_size": {c: _r(xs[-1] if xs else 0.0) for c, xs in by_size.items()},
            "gpu_hours_lost": {c: _r(self.lost_gpu_s[c] / 3600) for c in LOSS_CAUSES},
            "useful_utilization": _r(self.useful_gpu_s / (self.total_gpus * makespan)
                                     if makespan > 0 else 0.0),
            "wall_s": round(wall, 3),
        }


def _r(x: float) -> float:
    return round(float(x), 6)


def simulate(trace: Sequence[TraceJob], policy: str = "rackwise", cfg: SimConfig | None = None,
             progress: Progress | None = None) -> SimResult:
    """Replay ``trace`` under ``policy``; deterministic for a given config and seed."""
    if policy not in POLICY_NAMES:
        raise ValueError(f"unknown policy {policy!r}")
    return Simulation(trace, policy, cfg or SimConfig(), progress).run()
