"""The faithful baselines: each rule pinned to its documented Slurm or Kueue behaviour
on a small hand-made case (see placement/README.md for the sources)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from placement.model import Fleet, JobRequest
from placement.place import place
from placement.sim.simulation import FAIL, SimConfig, Simulation
from placement.sim.trace import TraceJob, read_trace

ROOT = Path(__file__).resolve().parents[2]
# No random failures (MTBF 0 turns them off), one 18-node rack unless said otherwise.
QUIET = dict(racks=1, node_mtbf_hours=0.0)


def _job(
    jid: str,
    nodes: int,
    submit: float,
    duration: float,
    *,
    gpus: int | None = None,
    priority: int = 0,
    locality: str = "required",
    segment: int | None = None,
) -> TraceJob:
    job = JobRequest(
        jid,
        num_gpus=gpus or nodes * 4,
        locality=locality,
        priority=priority,
        segment_nodes=segment,
        submit_time=submit,
        expected_duration=duration,
    )
    return TraceJob(job, submit, duration, 0)


def _replay(trace: list[TraceJob], policy: str, **cfg: object) -> Simulation:
    sim = Simulation(trace, policy, SimConfig(**{**QUIET, **cfg}))  # type: ignore[arg-type]
    sim.run()
    return sim


def _starts(sim: Simulation) -> dict[str, float | None]:
    return {jid: st.first_start for jid, st in sim.jobs.items()}


# A runs on 10 of the 18 nodes until t=1000. The head job B needs the whole rack.
# C fits in the 8 idle nodes now but would still run at t=1000; D fits and ends first.
BACKFILL_CASE = [
    _job("A", 10, 0, 1000),
    _job("B", 18, 1, 500),
    _job("C", 8, 2, 5000),
    _job("D", 8, 3, 900),
]


def test_backfill_never_delays_the_reserved_head_job() -> None:
    starts = _starts(_replay(BACKFILL_CASE, "slurm-block"))
    assert starts["B"] == 1000  # reserved at the earliest time it can start: A's end
    assert starts["C"] is not None and starts["C"] >= 1000 + 500  # after B, not before


def test_backfill_starts_a_short_job_that_ends_before_the_reservation() -> None:
    starts = _starts(_replay(BACKFILL_CASE, "slurm-block"))
    assert starts["D"] == 3  # ends at 903, before B's reservation at 1000


def test_the_greedy_variant_still_starts_anything_that_fits() -> None:
    starts = _starts(_replay(BACKFILL_CASE, "slurm-block-greedy"))
    assert starts["C"] == 2  # it jumps the blocked head...
    assert starts["B"] is not None and starts["B"] > 1000  # ...which waits for C to end


def test_bf_min_age_reserve_withholds_the_reservation_from_a_young_job() -> None:
    # Reservations only for jobs pending at least bf_min_age_reserve: with an hour,
    # B is too young at t=2, so C backfills (and delays B), as Slurm documents.
    starts = _starts(_replay(BACKFILL_CASE, "slurm-block", bf_min_age_reserve_s=3600.0))
    assert starts["C"] == 2


def test_bf_window_limits_how_far_ahead_reservations_are_made() -> None:
    # B cannot start within a 100 s window, so it gets no reservation and C backfills.
    starts = _starts(_replay(BACKFILL_CASE, "slurm-block", bf_window_s=100.0))
    assert starts["C"] == 2


def test_priority_comes_first_then_submit_time() -> None:
    trace = [
        _job("A", 18, 0, 1000),
        _job("low", 18, 1, 100),
        _job("high", 18, 2, 100, priority=5),
        _job("later", 18, 3, 100),
    ]
    for policy in ("slurm-block", "kueue-tas"):
        starts = _starts(_replay(trace, policy))
        assert starts["high"] == 1000, policy
        assert starts["low"] == 1100, policy  # same priority as "later": submit time
        assert starts["later"] == 1200, policy


def test_slurm_block_top_level_covers_three_racks() -> None:
    # 36 nodes in segments of 12: 12 per 18-node rack, so all three racks. Slurm's top
    # block level covers every base block, even when there are not 2**k of them.
    fleet = Fleet.uniform(3)
    job = JobRequest("big", num_gpus=144, segment_nodes=12, locality="required")
    plan = place(fleet, job, "slurm-block")
    assert plan.placed, plan.reason
    assert sorted(len(s) for s in plan.segments) == [12, 12, 12]
    assert len(plan.racks) == 3
    assert all(len({n[:4] for n in seg}) == 1 for seg in plan.segments)
    sim = _replay([_job("big", 36, 0, 100, segment=12)], "slurm-block", racks=3)
    assert sim.counts["rejected"] == 0 and sim.jobs["big"].end == 100


def test_slurm_block_still_picks_the_smallest_level_that_holds_the_job() -> None:
    fleet = Fleet.uniform(3)
    plan = place(fleet, JobRequest("g", num_gpus=96, locality="required"), "slurm-block")
    assert plan.placed and len(plan.racks) == 2  # 24 nodes: a level-2 block, not the top


def test_kueue_strict_fifo_head_blocks_the_workloads_behind_it() -> None:
    trace = [
        _job("A", 10, 0, 1000),
        _job("head", 18, 1, 500),
        _job("small", 1, 2, 10, gpus=1),  # would fit on the 8 idle nodes at once
    ]
    starts = _starts(_replay(trace, "kueue-tas"))
    assert starts["head"] == 1000
    assert starts["small"] == 1500  # blocked behind the head until it ends
    # Best-effort FIFO (the greedy queue) would have started it at once.
    assert _starts(_replay(trace, "slurm-block-greedy"))["small"] == 2


def test_a_requeued_job_goes_back_by_its_submit_time() -> None:
    # Two racks, each busy with one whole-rack job; C waits. A node of A or B fails at
    # t=500: that job is requeued and, once the node is repaired, it starts before C,
    # which was submitted later (Slurm keeps the job's submit time on requeue).
    trace = [_job("A", 18, 0, 1000), _job("B", 18, 10, 1000), _job("C", 18, 20, 1000)]
    sim = Simulation(trace, "slurm-block", SimConfig(racks=2, node_mtbf_hours=1e12, repair_hours=0.1))
    sim.push(500.0, FAIL, "")
    sim.run()
    assert sim.counts["requeues"] == 1
    requeued = next(st for st in sim.jobs.values() if st.restarts)
    c = sim.jobs["C"]
    assert c.first_start is not None and requeued.run_start < c.first_start
    assert requeued.run_start == pytest.approx(500 + 360)  # when the node is back


def test_locality_fills_in_rows_that_have_none(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("job_id,submit_time,duration,num_gpus,locality\na,0,100,16,\nb,0,100,16,none\n")
    trace = read_trace(path)
    assert [t.locality_given for t in trace] == [False, True]
    for loc in ("required", "preferred", "none"):
        sim = _replay(trace, "rackwise", locality=loc)
        assert sim.jobs["a"].job.locality == loc
        assert sim.jobs["b"].job.locality == "none"
    assert _replay(trace, "rackwise").jobs["a"].job.locality == "required"
    res = subprocess.run(
        [sys.executable, "-m", "placement.sim.cli", str(path), "--racks", "1", "--locality", "preferred"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "rows without locality: preferred" in res.stdout


def test_a_single_node_job_is_reserved_too() -> None:
    # A holds 17 nodes; P holds 2 GPUs of the last node until t=1000. S needs the
    # node's 4 GPUs: its reservation starts at 1000. T would fit on the 2 free GPUs
    # now but run past 1000, so it waits; U ends by then and backfills.
    trace = [
        _job("A", 17, 0, 5000),
        _job("P", 1, 0, 1000, gpus=2),
        _job("S", 1, 1, 100, gpus=4),
        _job("T", 1, 2, 5000, gpus=2),
        _job("U", 1, 3, 400, gpus=2),
    ]
    starts = _starts(_replay(trace, "slurm-block"))
    assert starts["S"] == 1000
    assert starts["U"] == 3
    assert starts["T"] is not None and starts["T"] >= 1100
    assert _starts(_replay(trace, "slurm-block-greedy"))["T"] == 2


def test_a_deferred_reservation_is_made_as_of_the_cycle_that_asked_for_it() -> None:
    # Backfill makes a reservation only when a later job could start (reserve_later).
    # A holds 17 nodes until just past bf_window (1440 min) from t=0, so the t=0 cycle
    # finds B no start within its window and reserves nothing. C arrives at t=1 and
    # would fit: B's reservation is made then, but as of t=0, whose window A's end is
    # past (made as of t=1 it would hold the rack from A's end and keep C out).
    window = 1440 * 60.0
    trace = [_job("A", 17, 0, window + 0.5), _job("B", 18, 0, 500), _job("C", 1, 1, 100_000)]
    starts = _starts(_replay(trace, "slurm-block"))
    assert starts["C"] == 1
    assert starts["B"] == 100_001
