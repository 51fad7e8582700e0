"""rackwise's queue in the simulator: backfill with reservations for gangs, visited by
expansion factor (placement/queues.py, ``expansion_factor``)."""

from __future__ import annotations

from placement.model import JobRequest
from placement.queues import Hold, expansion_factor
from placement.sim.simulation import FAIL, SimConfig, Simulation
from placement.sim.trace import TraceJob

QUIET = dict(racks=1, node_mtbf_hours=0.0, defrag_after_s=None)


def _job(
    jid: str,
    nodes: int,
    submit: float,
    duration: float,
    *,
    gpus: int | None = None,
    priority: int = 0,
    preemptible: bool = True,
) -> TraceJob:
    job = JobRequest(
        jid,
        num_gpus=gpus or nodes * 4,
        priority=priority,
        submit_time=submit,
        expected_duration=duration,
        preemptible=preemptible,
    )
    return TraceJob(job, submit, duration, 0)


def _starts(trace: list[TraceJob], **cfg: object) -> dict[str, float | None]:
    sim = Simulation(trace, "rackwise", SimConfig(**{**QUIET, **cfg}))  # type: ignore[arg-type]
    sim.run()
    return {jid: st.first_start for jid, st in sim.jobs.items()}


def test_the_expansion_factor_is_the_bounded_slowdown_so_far() -> None:
    assert expansion_factor(0, 3600) == 1.0  # not waited yet: the lowest
    assert expansion_factor(3600, 3600) == 2.0
    assert expansion_factor(60, 10) == 1.0  # short runs count as tau (600 s)
    assert expansion_factor(1200, 10) == (1200 + 10) / 600


def test_a_short_job_that_waited_goes_before_an_older_long_one() -> None:
    # A fills the rack until t=1000. L (10 nodes, 10 h) was submitted before S
    # (10 nodes, 10 min); at t=1000 only one of them fits. By expansion factor S has
    # waited 990 s against a 600 s run (2.65), L 999 s against 36,000 s (1.03).
    trace = [_job("A", 18, 0, 1000), _job("L", 10, 1, 36_000), _job("S", 10, 10, 600)]
    starts = _starts(trace)
    assert starts["S"] == 1000
    assert starts["L"] == 1600  # S ends, L starts: it waited, it did not starve
    # In plain priority order (Slurm's), L would go first.
    assert _starts(trace, rackwise_order="fifo")["L"] == 1000


def test_backfill_never_delays_the_reserved_gang() -> None:
    # A runs on 10 nodes until t=1000; B needs the whole rack and is reserved for
    # then. C fits now but would run past 1000: it waits. D ends by 1000: it starts.
    trace = [_job("A", 10, 0, 1000), _job("B", 18, 1, 500), _job("C", 8, 2, 5000), _job("D", 8, 3, 900)]
    starts = _starts(trace)
    assert starts["B"] == 1000
    assert starts["D"] == 3
    assert starts["C"] is not None and starts["C"] >= 1500


def test_single_node_jobs_take_no_reservation() -> None:
    # A holds 17 nodes; P holds 2 GPUs of the last node until t=1000. S needs all 4
    # GPUs of a node and cannot start, but it reserves nothing, so T, which would run
    # past 1000 on the 2 free GPUs, starts now (under slurm-block it waits for S).
    trace = [
        _job("A", 17, 0, 5000),
        _job("P", 1, 0, 1000, gpus=2),
        _job("S", 1, 1, 100, gpus=4),
        _job("T", 1, 2, 5000, gpus=2),
    ]
    starts = _starts(trace)
    assert starts["T"] == 2
    assert starts["S"] == 5000  # the node frees when T and A are gone


def test_priority_still_comes_first() -> None:
    trace = [_job("A", 18, 0, 1000), _job("S", 10, 1, 600), _job("H", 10, 500, 36_000, priority=5)]
    starts = _starts(trace)
    assert starts["H"] == 1000  # higher priority, though S's factor is larger


def test_a_preemptible_gang_is_not_held_back_by_a_blocked_non_preemptible_one() -> None:
    # A holds 3 nodes until t=1000: 15 idle. N (14 nodes, not preemptible) is offered
    # 13 (the rack keeps its 2 spares from it); P, the same size but preemptible, may
    # borrow the spares and fits. A refusal is remembered per shape for the cycle;
    # preemptibility is part of the shape, so N's refusal does not stand for P.
    trace = [
        _job("A", 3, 0, 1000, preemptible=False),
        _job("N", 14, 1, 100, preemptible=False),
        _job("P", 14, 1, 100),
    ]
    starts = _starts(trace)
    assert starts["P"] == 1
    assert starts["N"] == 1000


class _Recorder(Simulation):
    """Records the holds of each backfill cycle (a cycle goes on over passes that only
    add arrivals), with the time it began."""

    def __init__(self, *a: object, **k: object) -> None:
        super().__init__(*a, **k)  # type: ignore[arg-type]
        self.seen: list[tuple[float, list[Hold]]] = []
        self._cycle: object = None

    def _pass(self, now: float) -> None:
        super()._pass(now)
        if self.bf is not None and self.bf.holds:
            if self.bf is not self._cycle:
                self._cycle = self.bf
                self.seen.append((now, []))
            self.seen[-1] = (self.seen[-1][0], list(self.bf.holds))


# A holds 10 nodes until 1000, E 4 until 400, D 4 until 302: the rack is full. B needs
# all 18 nodes: reserved for 1000 when D (behind it, ending before then) starts at 2.
# At 302 D ends and G (behind B, ending by 802) starts: B's hold is needed again.
KEEP_TRACE = [
    _job("A", 10, 0, 1000),
    _job("E", 4, 0, 400),
    _job("B", 18, 1, 500),
    _job("D", 4, 2, 300),
    _job("G", 4, 300, 500),
]


def _holds(trace: list[TraceJob], **cfg: object) -> _Recorder:
    sim = _Recorder(trace, "rackwise", SimConfig(**{**QUIET, **cfg}))  # type: ignore[arg-type]
    sim.run()
    return sim


def test_a_gangs_reservation_is_kept_across_completions() -> None:
    sim = _holds(KEEP_TRACE)
    mine = [(t, h) for t, hs in sim.seen for h in hs if h.job_id == "B"]
    assert [t for t, _ in mine] == [2, 302]
    assert mine[0][1] is mine[1][1]  # the same hold, not planned again
    assert sim.jobs["B"].first_start == 1000 and sim.jobs["G"].first_start == 302
    # Planned again every cycle (Slurm's way), it is an equal hold made anew.
    again = [h for _, hs in _holds(KEEP_TRACE, rackwise_keep_reservations=False).seen for h in hs]
    assert len(again) == 2 and again[0] is not again[1] and again[0] == again[1]


class _FailA(_Recorder):
    """Fails a node of job A when the pushed FAIL event comes."""

    def _fail(self, t: float) -> None:
        self.node_ids = sorted(self.fleet.allocations["A"].nodes)[:1]
        super()._fail(t)


def test_a_kept_reservation_is_dropped_when_capacity_comes_back_early() -> None:
    # A node of A fails at 200 and is back at 236; A is requeued, its nodes free long
    # before 1000. At 302 (D ends) B's earliest start is 400, when E ends: planned
    # again, B is reserved for then, and G (which would run past 400) waits. Kept, the
    # hold for 1000 would have let G start and B wait until 1000.
    sim = _FailA(
        KEEP_TRACE,
        "rackwise",
        SimConfig(
            **{
                **QUIET,
                "node_mtbf_hours": 1e12,  # type: ignore[arg-type]
                "repair_hours": 0.01,
            }
        ),
    )
    sim.push(200.0, FAIL, "")
    sim.run()
    assert sim.counts["requeues"] == 1 and sim.jobs["A"].restarts == 1
    assert sim.jobs["B"].first_start == 400
    assert sim.jobs["G"].first_start is not None and sim.jobs["G"].first_start >= 900
