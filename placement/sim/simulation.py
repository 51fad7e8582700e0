"""The discrete-event trace replay behind ``python -m placement.sim.cli``.

Events: arrivals, completions, node failures, node repairs. After every batch of
events at one instant, a queue pass starts what may start. Failures follow one
seeded sequence (exponential gaps, MTBF per node, node picked uniformly), the same
for every policy, so policies face identical faults while the run lasts. Failures
may be announced ahead, and rackwise may drain a flagged node before it fails
(``placement/sim/precursors.py``); the failures stay the same.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
import time
from collections.abc import Callable, Sequence

from placement.defrag import defragment
from placement.fragmentation import fragmentation
from placement.model import FAILED, HEALTHY, Allocation, Fleet
from placement.place import can_ever_fit
from placement.policies.common import min_racks
from placement.recover import apply_recovery, recover
from placement.sim.precursors import DrainPasses
from placement.sim.preempt import TENANT_POLICIES, TenantPasses
from placement.sim.state import (
    ARRIVE,
    COMPLETE,
    DRAW,
    FAIL,
    FLAG,
    LOSS_CAUSES,
    RELAUNCH,
    REPAIR,
    SIZE_CLASSES,
    JobState,
    SimConfig,
    SimResult,
    fingerprint,
    metrics,
    size_class,
)
from placement.sim.tenancy import Tenancy
from placement.sim.trace import TraceJob
from placement.timeline import NodeEnds
from placement.validate import validate, validate_indexes

# The simulator's public names (placement.sim.cli, the benchmarks and tests read
# them from here).
__all__ = [
    "COMPLETE",
    "FAIL",
    "POLICY_NAMES",
    "SIZE_CLASSES",
    "JobState",
    "SimConfig",
    "SimResult",
    "Simulation",
    "simulate",
    "size_class",
]

POLICY_NAMES = ("rackwise", "first-fit", "random", "slurm-block", "slurm-block-greedy", "kueue-tas")
# Policies whose failed jobs are requeued whole (Slurm --requeue, and the blind ones).
REQUEUE_ON_FAILURE = ("first-fit", "random", "slurm-block", "slurm-block-greedy")

Progress = Callable[[str, float, int, int], None]


class Simulation(TenantPasses, DrainPasses):
    """One policy over one trace. Call :meth:`run`."""

    def __init__(
        self, trace: Sequence[TraceJob], policy: str, cfg: SimConfig, progress: Progress | None = None
    ) -> None:
        self.cfg = cfg
        self.policy = policy
        self.fleet = Fleet.uniform(
            cfg.racks, cfg.nodes_per_rack, cfg.gpus_per_node, spare_nodes=cfg.spare_nodes
        )
        self.node_ids = list(self.fleet.nodes)
        self.total_gpus = self.fleet.total_gpus
        self.rng = random.Random(cfg.seed + 1)  # policy choices (random policy)
        self.fail_rng = random.Random(cfg.seed)  # the failure sequence
        self.progress = progress
        self.heap: list[tuple[float, int, int, str]] = []
        self.seq = 0
        self.jobs: dict[str, JobState] = {}
        self.trace = trace
        # The queue's state (its types: QueuePasses). Queued jobs grouped by shape (a
        # shape with none queued has no entry); within a group by (priority, submit,
        # seq).
        self.groups = {}
        self.blocked = set()
        self.reserved = frozenset()
        self.reserved_until = None
        self.reserved_for = None
        self.queued = 0
        self.running = set()
        self.unfinished = 0
        self.repairs_pending = 0
        self.arrivals_left = 0
        self.held_gpu_s = 0.0
        self.useful_gpu_s = 0.0
        self.counts = {"failures": 0, "in_place_recoveries": 0, "requeues": 0, "migrations": 0, "rejected": 0}
        self.migration_gpu_s = 0.0
        # Preemption (a shared fleet's reclaims) and drain-before-failure's restarts
        # are counted apart: metrics() reports LOSS_CAUSES, the tenants' and the
        # precursors' figures the rest.
        self.lost_gpu_s = dict.fromkeys((*LOSS_CAUSES, "preemption", "precautions"), 0.0)
        self.failure_log: list[tuple[float, str]] = []  # (when, node) of each failure
        self._init_precursors()
        self.relaunches_pending = 0
        self.series: list[tuple[float, float, int, float]] = []
        self.held_now = 0
        self.done = 0
        self.defrag_tried: dict[str, float] = {}
        # Queue-discipline state, dropped whenever capacity comes back (_freed).
        self.bf = None  # slurm-block: this cycle's reservations
        self.kept_holds = {}  # rackwise: reservations carried across cycles, by job
        self.node_ends = None  # when nodes free up, kept across cycles
        self.bf_last = None  # last job it looked at
        self.fresh = []  # queued since the last pass
        self.fifo_blocked = None  # kueue-tas: the head that does not fit
        # Backfill's room tests by (shape, rack group): they read only the shape and
        # the racks' sizes, which never change.
        self.room_tests = {}
        # A shared fleet (opt-in): quotas, fair share, reclaim (placement/sim/preempt.py).
        self.tenancy = None
        self.again = False
        self.preempt_failed = set()
        self.fs_factors = {}
        if cfg.tenants is not None:
            if policy not in TENANT_POLICIES or (policy == "rackwise" and cfg.rackwise_queue != "backfill"):
                raise ValueError(f"tenants are modelled for {', '.join(TENANT_POLICIES)} (backfill) only")
            self.tenancy = Tenancy(cfg.tenants, self.total_gpus, cfg.gpus_per_node, policy)

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
            st = JobState(job, tj.submit, tj.duration, (-job.priority, tj.submit, i), remaining=tj.duration)
            self.jobs[tj.job.id] = st
            self.push(tj.submit, ARRIVE, tj.job.id)
        self.arrivals_left = len(self.trace)
        self.unfinished = len(self.trace)
        fail_gap = (
            cfg.node_mtbf_hours * 3600 / len(self.node_ids)
            if cfg.node_mtbf_hours > 0 and self.node_ids
            else 0.0
        )
        if self.precursors_on and self.trace:
            # Failures drawn ahead (the same ones), with their signals.
            self._start_precursors(first_submit, fail_gap)
        elif fail_gap and self.trace:
            self.push(first_submit + self.fail_rng.expovariate(1 / fail_gap), FAIL, "")
        last_t = first_submit
        span = max((t.submit for t in self.trace), default=0.0) - first_submit
        sample_dt = (span * 1.5 / cfg.samples) if cfg.samples else math.inf
        next_sample = first_submit
        shapes_seen: dict[int, float] = {}
        last_progress = 0.0
        ten = self.tenancy
        while self.heap:
            t = self.heap[0][0]
            if ten is not None:
                ten.advance(t)
            if self.draining:
                self._drain_tick(t)
            bookkeeping = True  # only failures drawn ahead at this instant
            while self.heap and self.heap[0][0] == t:
                _, kind, _, key = heapq.heappop(self.heap)
                if kind == DRAW:
                    self._precursor_event(t, kind, key)
                    continue
                bookkeeping = False
                if kind == ARRIVE:
                    self._arrive(t, key)
                    g = self.jobs[key].job.total_gpus
                    shapes_seen[g] = shapes_seen.get(g, 0) + 1
                elif kind == COMPLETE:
                    self._complete(t, key)
                elif kind == FAIL:
                    if key:  # drawn ahead, with its node
                        self._fail(t, key)
                    else:
                        self._fail(t)
                    if self.unfinished > 0:
                        if self.draws is not None:
                            self._draw_failures(t)
                        else:
                            self.push(t + self.fail_rng.expovariate(1 / fail_gap), FAIL, "")
                elif kind == RELAUNCH:
                    self.relaunches_pending -= 1
                    self._enqueue(self.jobs[key])
                elif kind == REPAIR:
                    self.fleet.set_health(key, HEALTHY)
                    self.repairs_pending -= 1
                    self._freed()
                elif kind >= FLAG:
                    self._precursor_event(t, kind, key)
            if bookkeeping:
                continue  # nothing changed: no queue pass, so decisions stay the same
            if self.flags:
                self._retry_precautions(t)
            self._pass(t)
            if ten is not None:
                ten.observe(t)
            if self.policy == "rackwise" and cfg.defrag_after_s is not None:
                self._defrag(t)
            if cfg.check_invariants:
                self._check(t)
            last_t = max(last_t, t)
            if (
                self.queued
                and not self.running
                and not self.arrivals_left
                and not self.repairs_pending
                and not self.relaunches_pending
                and not self.flags
            ):
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
        figures = metrics(self, first_submit, time.perf_counter() - wall0)
        if ten is not None:
            figures["tenants"] = ten.report(self.lost_gpu_s["preemption"])
        if self.precursors_on:
            figures["precursors"] = self.precursor_report()
        return SimResult(
            self.policy,
            figures,
            self.series,
            fingerprint(self.jobs),
        )

    def _check(self, t: float) -> None:
        # Jobs on a node that failed this instant were recovered already, so the
        # whole fleet must be clean; blind baselines cannot honour topology rules.
        bad: list[object] = list(validate(self.fleet, topology=self.policy not in ("first-fit", "random")))
        bad += validate_indexes(self.fleet)
        if self.node_ends is not None:
            # The node ends kept across backfill cycles equal ones built afresh.
            kept = self.node_ends
            kept.refresh()
            fresh = NodeEnds(self.fleet, track=False)
            if (kept.free_at, kept.ends, kept.rack_ends) != (fresh.free_at, fresh.ends, fresh.rack_ends):
                bad.append("backfill node ends drifted from the fleet")
        ten = self.tenancy
        if ten is not None:
            held = sum(a.gpus for a in self.fleet.allocations.values())
            if sum(ten.ledger.usage.values()) != held or held > self.total_gpus:
                bad.append(f"tenants hold {sum(ten.ledger.usage.values())} GPUs, the fleet {held}")
            if ten.below_nominal:
                bad.append("a reclaim preempted a tenant at or under its nominal quota")
        if bad:
            raise AssertionError(f"t={t}: {bad[:3]}")

    def _defrag(self, now: float) -> None:
        """Plan and apply moves for the longest-blocked gang, at most once per
        ``defrag_after_s`` per job (planning is not free)."""
        cfg = self.cfg
        assert cfg.defrag_after_s is not None
        heads = [g[0] for g in self.groups.values()]
        blocked = sorted(
            (
                st
                for st in heads
                if not st.job.is_small(cfg.gpus_per_node)
                and now - st.submit >= cfg.defrag_after_s
                and now - self.defrag_tried.get(st.job.id, -math.inf) >= cfg.defrag_after_s
            ),
            key=lambda st: st.order,
        )
        if not blocked:
            return
        st = blocked[0]
        self.defrag_tried[st.job.id] = now
        plan = defragment(
            self.fleet,
            [st.job],
            budget_gpu_hours=cfg.defrag_budget_gpu_hours,
            restart_minutes=cfg.restart_minutes,
            now=now,
            figures=False,
        )
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

    def _reject_stuck(self) -> None:
        for group in self.groups.values():
            for st in group:
                if self.tenancy is not None:
                    self.tenancy.dequeued(st.job)
                self.counts["rejected"] += 1
                self.unfinished -= 1
                st.end = None
        self.groups.clear()
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
        if self.tenancy is not None:
            self.tenancy.started(job, st.gpus)
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
        if self.tenancy is not None:
            self.tenancy.stopped(st.job, st.gpus)
        self.fleet.release(jid)
        st.end = t
        st.remaining = 0.0
        self.unfinished -= 1
        self.done += 1
        self._freed(early=False)

    def _charge(self, st: JobState, elapsed: float, saved: float | None, cause: str = "failures") -> None:
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

    def _interrupt(self, t: float, st: JobState, cause: str = "failures", keep_all: bool = False) -> float:
        """Stop the current run: bank the work up to the last checkpoint (``keep_all``:
        all of it, a checkpoint taken now, as before a precautionary move).

        Returns the GPU-seconds lost (work since the checkpoint plus restart time)."""
        ckpt = self.cfg.checkpoint_minutes * 60
        elapsed = t - st.run_start
        productive = max(0.0, elapsed - st.penalty)
        saved = math.floor(productive / ckpt) * ckpt if ckpt > 0 and not keep_all else productive
        st.remaining = max(0.0, st.remaining - saved * st.speed)
        self._charge(st, elapsed, saved, cause)
        st.restart_cause = cause
        self.held_gpu_s += st.gpus * elapsed
        self.held_now -= st.gpus
        self.running.discard(st.job.id)
        if self.tenancy is not None:
            self.tenancy.stopped(st.job, st.gpus)
        st.restarts += 1
        st.version += 1
        return st.gpus * (productive - saved + st.penalty)

    def _requeue(self, t: float, st: JobState, cause: str = "failures") -> None:
        self._interrupt(t, st, cause)
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

    def _fail(self, t: float, nid: str = "") -> None:
        # Drawn now, or ahead with the precursors (then the event carries the node).
        nid = nid or self.node_ids[self.fail_rng.randrange(len(self.node_ids))]
        node = self.fleet.nodes[nid]
        if node.health == FAILED:
            return
        self.failure_log.append((t, nid))
        self._flag_failed(nid)
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
        # With drain-before-failure, a job may also hold flagged nodes: it leaves them.
        hit = self._off_nodes(jid, nid) if self.draining else [nid]
        if self.policy in REQUEUE_ON_FAILURE:
            self._requeue(t, st)  # Slurm --requeue: the whole job goes back to the queue
            return
        if self.policy == "kueue-tas":
            plan = recover(self.fleet, jid, hit, policy="kueue-tas", now=t)
            if plan.action != "swap":
                self._requeue(t, st)
                return
        else:
            plan = recover(
                self.fleet, jid, hit, policy="rackwise", restart_minutes=self.cfg.restart_minutes, now=t
            )
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


def simulate(
    trace: Sequence[TraceJob],
    policy: str = "rackwise",
    cfg: SimConfig | None = None,
    progress: Progress | None = None,
) -> SimResult:
    """Replay ``trace`` under ``policy``; deterministic for a given config and seed."""
    if policy not in POLICY_NAMES:
        raise ValueError(f"unknown policy {policy!r}")
    return Simulation(trace, policy, cfg or SimConfig(), progress).run()
