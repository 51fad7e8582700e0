"""Failures announced ahead, and rackwise's drain-before-failure (issue #31).

The model (``SimConfig.precursor_*``, ``false_alarm_per_node_day``):

1. The failure sequence is the simulator's own: exponential gaps at the fleet's rate
   (``node_mtbf_hours`` per node), the node picked uniformly, drawn from the
   failure stream in the same order as ever (gap, node, gap, node, ...). With
   precursors on, failures are drawn ahead of time (far enough for the longest lead)
   instead of one at a time; the values are the same, so a replay with precursors
   meets the very failures, at the very instants, of one without.
2. For each failure, a second stream (seeded apart) draws whether a signal
   announces it (probability ``precursor_share``) and its lead, uniform in
   [0.5, 1.5] x ``precursor_lead_s``. Both numbers are drawn for every failure, so
   the failures announced at share 0.25 are among those announced at 0.5, and a
   failure's lead scales with the mean: the settings of a sweep are coupled.
3. A third stream raises false alarms: a Poisson stream of
   ``false_alarm_per_node_day`` per node and day, each on a node picked uniformly.
4. A flag (true or false) lasts until its node fails or ``precursor_clear_s`` has
   passed (None: 1.5 x ``precursor_lead_s``, the longest lead, after which a true
   signal's failure has come). The policy cannot tell true from false flags.

The reaction (rackwise with ``drain_before_failure``; every other policy, and rackwise
without it, ignores flags: reactive recovery, the baseline):

1. The flagged node takes no new work (its health is ``draining``); it is drained
   as its jobs end, and healthy again when the flag clears (or repaired after it
   fails).
2. Each job on it that would not end before the expected failure (its expected end
   after flag time + ``precursor_lead_s``) is checkpointed at once and moved off:
   ``recover()`` without preemption, so a swap onto an idle node of the same rack
   when there is one, else a move of the whole job to the fewest racks that hold it.
   The move pays the restart (``restart_minutes``, charged to ``precautions``) and
   loses no work: the checkpoint is taken at the move. A job with nowhere to go
   stays and meets the failure, if it comes, as before.
3. Accounting: GPU-hours lost to failures (``gpu_hours_lost.failures``, as ever),
   the precautionary restarts, and the idle GPUs of flagged nodes while flagged
   (capacity held back by the drain, false alarms included; every idle GPU of a
   flagged node counts, whether or not a queued job could have used it, so this
   overstates the cost).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from placement.model import DRAINING, FAILED, HEALTHY, Allocation, Fleet
from placement.queues import Backfill
from placement.recover import apply_recovery, recover
from placement.sim.state import ALARM, DRAW, FAIL, FLAG, UNFLAG, JobState, SimConfig

# A lead is uniform in [1 - SPREAD, 1 + SPREAD] x precursor_lead_s.
LEAD_SPREAD = 0.5


class FailureDraws:
    """The failure sequence drawn ahead, each failure with its signal (or none)."""

    def __init__(self, cfg: SimConfig, node_ids: list[str], start: float, gap: float, horizon: float) -> None:
        self.cfg = cfg
        self.node_ids = node_ids
        self.gap = gap
        self.last_t = start  # the latest failure drawn
        self.signal_rng = random.Random(f"precursors:{cfg.seed}")
        # Failures must be known this far ahead of now: the longest lead (none when
        # no signal is announced or no one listens).
        self.horizon = horizon

    def draw(self, fail_rng: random.Random) -> tuple[float, str, float | None]:
        """The next failure: its time, its node and when its signal comes (None: not
        announced). ``fail_rng`` is drawn in the order the simulator always did."""
        self.last_t += fail_rng.expovariate(1 / self.gap)
        nid = self.node_ids[fail_rng.randrange(len(self.node_ids))]
        announced, unit = self.signal_rng.random(), self.signal_rng.random()
        if announced >= self.cfg.precursor_share:
            return self.last_t, nid, None
        lead = self.cfg.precursor_lead_s * (1 - LEAD_SPREAD + 2 * LEAD_SPREAD * unit)
        return self.last_t, nid, self.last_t - lead


@dataclass
class Flag:
    """A flagged node: until when, whether a failure is really coming (the replay's
    knowledge, for the figures; the policy never reads it), and when the policy
    expects the failure (flag time + ``precursor_lead_s``)."""

    until: float
    true: bool
    expected: float


class DrainPasses:
    """The precursor half of a replay: signals, flags and drain-before-failure. A
    mixin of ``placement.sim.simulation.Simulation``, whose state it shares."""

    # Set up by Simulation.__init__ (see there).
    cfg: SimConfig
    policy: str
    fleet: Fleet
    node_ids: list[str]
    jobs: dict[str, JobState]
    running: set[str]
    unfinished: int
    queued: int
    heap: list[tuple[float, int, int, str]]
    fail_rng: random.Random
    lost_gpu_s: dict[str, float]
    bf: Backfill | None

    def push(self, t: float, kind: int, key: str) -> None:
        raise NotImplementedError  # the Simulation's

    def _interrupt(self, t: float, st: JobState, cause: str = "failures", keep_all: bool = False) -> float:
        raise NotImplementedError  # the Simulation's

    def _begin_run(self, t: float, st: JobState, alloc: Allocation) -> None:
        raise NotImplementedError  # the Simulation's

    def _freed(self, early: bool = True) -> None:
        raise NotImplementedError  # QueuePasses'

    def _init_precursors(self) -> None:
        cfg = self.cfg
        self.precursors_on = cfg.precursor_share > 0 or cfg.false_alarm_per_node_day > 0
        # Only rackwise reacts; the others (and the reactive baseline) never see a flag.
        self.draining = self.precursors_on and cfg.drain_before_failure and self.policy == "rackwise"
        self.draws: FailureDraws | None = None
        self.alarm_rng = random.Random(f"false-alarms:{cfg.seed}")
        self.clear_s = (
            cfg.precursor_clear_s
            if cfg.precursor_clear_s is not None
            else cfg.precursor_lead_s * (1 + LEAD_SPREAD)
        )
        self.flags: dict[str, Flag] = {}
        self.drain_t = 0.0
        self.pre = {
            "flags_true": 0,
            "flags_false": 0,
            "failures_flagged": 0,
            "precaution_swaps": 0,
            "precaution_moves": 0,
            "precaution_stayed": 0,
        }
        # Idle GPU-seconds of flagged nodes: [false alarms, true signals], and all of
        # them while some job waited in the queue.
        self.drained_gpu_s = [0.0, 0.0]
        self.drained_waiting_gpu_s = 0.0

    def _start_precursors(self, first: float, fail_gap: float) -> None:
        """Draw the first failures (with their signals) and the first false alarm."""
        self.drain_t = first
        if fail_gap:
            cfg = self.cfg
            ahead = cfg.precursor_lead_s * (1 + LEAD_SPREAD) if self.draining and cfg.precursor_share else 0.0
            self.draws = FailureDraws(cfg, self.node_ids, first, fail_gap, ahead)
            self._draw_failures(first)
        if self.draining and self.cfg.false_alarm_per_node_day > 0 and self.node_ids:
            self._next_alarm(first)

    def _draw_failures(self, now: float) -> None:
        """Push every failure due before now + the longest lead (and its signal), then
        a DRAW event for when more are needed."""
        draws = self.draws
        assert draws is not None
        drew = False
        while draws.last_t <= now + draws.horizon:
            t, nid, signal = draws.draw(self.fail_rng)
            self.push(t, FAIL, nid)
            if signal is not None and self.draining:
                self.push(max(now, signal), FLAG, nid)
            drew = True
        if drew and draws.horizon > 0:
            self.push(draws.last_t - draws.horizon, DRAW, "")

    def _next_alarm(self, now: float) -> None:
        rate = self.cfg.false_alarm_per_node_day * len(self.node_ids) / 86400.0
        self.push(now + self.alarm_rng.expovariate(rate), ALARM, "")

    def _precursor_event(self, t: float, kind: int, key: str) -> None:
        if kind == FLAG:
            self._flag(t, key, True)
        elif kind == ALARM:
            nid = self.node_ids[self.alarm_rng.randrange(len(self.node_ids))]
            self._flag(t, nid, False)
            if self.unfinished > 0:
                self._next_alarm(t)
        elif kind == UNFLAG:
            flag = self.flags.get(key)
            if flag is not None and flag.until <= t:
                del self.flags[key]
                if self.fleet.nodes[key].health == DRAINING:
                    self.fleet.set_health(key, HEALTHY)
                    self._freed()
        elif kind == DRAW and self.unfinished > 0:
            self._draw_failures(t)

    def _flag(self, t: float, nid: str, true: bool) -> None:
        """A signal on ``nid``: drain it, and move its long jobs off it."""
        node = self.fleet.nodes[nid]
        if node.health == FAILED:
            return  # already down (in repair): nothing to drain
        self.pre["flags_true" if true else "flags_false"] += 1
        flag = self.flags.get(nid)
        if flag is None:
            flag = self.flags[nid] = Flag(t + self.clear_s, true, t + self.cfg.precursor_lead_s)
        else:  # flagged again: held longer, and the earlier expectation stands
            flag.until, flag.true = t + self.clear_s, flag.true or true
        self.push(t + self.clear_s, UNFLAG, nid)
        if node.health == DRAINING:
            return  # flagged already: its jobs were dealt with then
        self.fleet.set_health(nid, DRAINING)
        self.bf = None  # a reservation may hold the node
        if self._move_off(t, nid, flag.expected, first=True):
            self._freed()

    def _move_off(self, t: float, nid: str, expected: float, first: bool = False) -> bool:
        """Move the jobs on flagged ``nid`` that would not end before ``expected``;
        True if one moved. ``first``: at the flag (counts the jobs that stay)."""
        moved = False
        for jid in sorted(self.fleet.nodes[nid].jobs):
            if jid not in self.running:
                continue
            alloc = self.fleet.allocations[jid]
            if alloc.expected_end is not None and alloc.expected_end <= expected:
                continue  # ends before the failure is expected: let it finish
            if self._precaution(t, self.jobs[jid], nid):
                moved = True
            elif first:
                self.pre["precaution_stayed"] += 1
        return moved

    def _retry_precautions(self, t: float) -> None:
        """Before the queue pass of an instant: jobs that had nowhere to go when their
        node was flagged try again, first call on capacity freed since (protecting
        running work before starting new work)."""
        moved = False
        for nid, flag in list(self.flags.items()):
            if t < flag.expected and self.fleet.nodes[nid].health == DRAINING:
                moved |= self._move_off(t, nid, flag.expected)
        if moved:
            self._freed()

    def _precaution(self, t: float, st: JobState, nid: str) -> bool:
        """Checkpoint ``st`` now and move it off the flagged node ``nid``: a same-rack
        swap, else a whole-job move, never a preemption. False if it must stay."""
        plan = recover(
            self.fleet,
            st.job.id,
            self._off_nodes(st.job.id, nid),
            policy="rackwise",
            restart_minutes=self.cfg.restart_minutes,
            now=t,
            preempt=False,
        )
        if plan.action not in ("swap", "move"):
            return False
        self._interrupt(t, st, cause="precautions", keep_all=True)
        alloc = apply_recovery(self.fleet, plan)
        assert alloc is not None
        self.pre["precaution_swaps" if plan.action == "swap" else "precaution_moves"] += 1
        self._begin_run(t, st, alloc)
        return True

    def _off_nodes(self, jid: str, nid: str) -> list[str]:
        """``nid`` and every other flagged node of the job: a restarted job leaves them
        all (the fleet takes no new allocation on a draining node)."""
        alloc = self.fleet.allocations[jid]
        nodes = self.fleet.nodes
        return [nid, *(n for n in alloc.nodes if n != nid and nodes[n].health == DRAINING)]

    def _flag_failed(self, nid: str) -> None:
        """``nid`` failed: its flag (if any) has served its purpose."""
        if self.flags.pop(nid, None) is not None:
            self.pre["failures_flagged"] += 1

    def _drain_tick(self, t: float) -> None:
        """Charge the idle GPUs of flagged nodes since the last instant (nothing on a
        node changes between instants, so this is exact)."""
        dt = t - self.drain_t
        if dt > 0 and self.flags:
            for flag_nid, flag in self.flags.items():
                node = self.fleet.nodes[flag_nid]
                idle = (node.gpus - node.used.bit_count()) * dt
                self.drained_gpu_s[flag.true] += idle
                if self.queued:
                    self.drained_waiting_gpu_s += idle
        self.drain_t = t

    def precursor_report(self) -> dict[str, float]:
        """The ``precursors`` figures of a replay with precursors on."""
        return {
            **self.pre,
            "gpu_hours_precautions": round(self.lost_gpu_s["precautions"] / 3600, 6),
            "gpu_hours_drained_idle": round(sum(self.drained_gpu_s) / 3600, 6),
            "gpu_hours_drained_idle_false_alarms": round(self.drained_gpu_s[False] / 3600, 6),
            "gpu_hours_drained_idle_waiting": round(self.drained_waiting_gpu_s / 3600, 6),
        }
