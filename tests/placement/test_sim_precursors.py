"""Failure precursors and drain-before-failure in the simulator (issue #31): the same
failures with and without them, moves before an announced failure, drained nodes,
false alarms. Values worked by hand on small traces; no database."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.model import JobRequest
from placement.sim.simulation import SimConfig, Simulation, simulate
from placement.sim.trace import TraceJob, parse_row
from placement.sim.tracegen import generate


def _trace(*rows: tuple[str, float, float, int]) -> list[TraceJob]:
    return [
        TraceJob(JobRequest(jid, num_gpus=g, locality="required"), sub, dur, i + 2)
        for i, (jid, sub, dur, g) in enumerate(rows)
    ]


def _cfg(**kw: Any) -> SimConfig:
    base: dict[str, Any] = {
        "racks": 1,
        "nodes_per_rack": 2,
        "gpus_per_node": 4,
        "node_mtbf_hours": 0.0,
        "spare_nodes": 0,
        "check_invariants": True,
    }
    return SimConfig(**{**base, **kw})


class _Rng:
    """A random stream by hand: gaps in turn (then never again), one fixed node."""

    def __init__(self, gaps: list[float], index: int) -> None:
        self.gaps, self.index = list(gaps), index

    def expovariate(self, _rate: float) -> float:
        return self.gaps.pop(0) if self.gaps else 1e15

    def randrange(self, _n: int) -> int:
        return self.index


def _tracegen(jobs: int = 300, racks: int = 4, seed: int = 3) -> list[TraceJob]:
    rows = generate(jobs, 0.85, racks=racks, seed=seed)
    return [parse_row({k: str(v) for k, v in r.items()}, i + 2, gpus_per_node=4) for i, r in enumerate(rows)]


def _fleet_cfg(**kw: Any) -> SimConfig:
    return SimConfig(**{"racks": 4, "node_mtbf_hours": 300.0, "check_invariants": True, **kw})


def _failures(trace: list[TraceJob], cfg: SimConfig) -> tuple[list[tuple[float, str]], dict[str, Any]]:
    sim = Simulation(trace, "rackwise", cfg)
    m = sim.run().metrics
    return sim.failure_log, m


def test_the_failures_are_the_same_with_precursors_on_and_off() -> None:
    trace = _tracegen()
    off, _ = _failures(trace, _fleet_cfg())
    on, m = _failures(
        trace, _fleet_cfg(precursor_share=0.5, precursor_lead_s=3600.0, false_alarm_per_node_day=0.05)
    )
    assert m["precursors"]["flags_true"] > 0 and m["precursors"]["flags_false"] > 0
    # The runs end at different times (drain changes the schedule); up to the end of
    # the shorter one, the very same nodes fail at the very same instants.
    n = min(len(off), len(on))
    assert n >= 10
    assert off[:n] == on[:n]


def test_reactive_recovery_with_signals_is_the_old_replay_exactly() -> None:
    trace = _tracegen()
    old = simulate(trace, "rackwise", _fleet_cfg())
    reactive = simulate(
        trace,
        "rackwise",
        _fleet_cfg(precursor_share=0.5, false_alarm_per_node_day=0.05, drain_before_failure=False),
    )
    quiet = simulate(trace, "rackwise", _fleet_cfg(precursor_share=0.0, false_alarm_per_node_day=0.0))
    assert old.fingerprint == reactive.fingerprint == quiet.fingerprint
    for key in ("gpu_hours_lost", "mean_jct_s", "failures", "goodput", "migrations"):
        assert old.metrics[key] == reactive.metrics[key] == quiet.metrics[key]
    assert "precursors" not in old.metrics and "precursors" not in quiet.metrics


def test_precursors_are_off_by_default() -> None:
    cfg = SimConfig()
    assert cfg.precursor_share == 0 and cfg.false_alarm_per_node_day == 0


def _gang_failure(**kw: Any) -> dict[str, Any]:
    """2 racks x 3 nodes; a 3-node gang (12 GPUs, 7200 s) from 0 s fills rack 0; its
    node 0 fails at 4000 s (a checkpoint at 3600 s: reactively 400 s of work and the
    600 s restart are lost). With ``precursor_share=1`` the failure is announced
    0.5-1.5 x 1800 s ahead, between 1300 s and 3100 s."""
    trace = _trace(("gang", 0, 7200, 12))
    cfg = _cfg(racks=2, nodes_per_rack=3, node_mtbf_hours=1.0, precursor_lead_s=1800.0, **kw)
    sim = Simulation(trace, "rackwise", cfg)
    sim.fail_rng = _Rng([4000.0], 0)  # type: ignore[assignment]
    return sim.run().metrics


def test_an_announced_failure_moves_a_long_gang_first_and_loses_no_work() -> None:
    reactive = _gang_failure(precursor_share=1.0, drain_before_failure=False)
    # The premise: reactively the failure hits the gang (moved to rack 1, no spare).
    assert reactive["failures"] == 1 and reactive["migrations"] == 1
    assert reactive["gpu_hours_lost"]["failures"] == pytest.approx(12 * 1000 / 3600, abs=1e-5)
    assert reactive["mean_jct_s"] == 4000 + 600 + 3600
    drained = _gang_failure(precursor_share=1.0)
    pre = drained["precursors"]
    assert drained["failures"] == 1 and pre["flags_true"] == 1 and pre["failures_flagged"] == 1
    # Checkpointed and moved at the signal: no work lost to the failure, only the
    # restart, charged to the precaution.
    assert pre["precaution_moves"] == 1 and pre["precaution_swaps"] == 0
    assert drained["gpu_hours_lost"]["failures"] == 0
    assert pre["gpu_hours_precautions"] == pytest.approx(12 * 600 / 3600, abs=1e-5)
    assert drained["mean_jct_s"] == 7200 + 600
    # Rack 0 stood idle from the move to the end: drained capacity, charged.
    assert pre["gpu_hours_drained_idle"] > 0


def _false_alarm(*rows: tuple[str, float, float, int], at: float = 10.0) -> dict[str, Any]:
    """1 rack x 2 nodes, no failures; one false alarm on node 0 at ``at``."""
    sim = Simulation(_trace(*rows), "rackwise", _cfg(false_alarm_per_node_day=1.0))
    sim.alarm_rng = _Rng([at], 0)  # type: ignore[assignment]
    return sim.run().metrics


def test_a_flagged_idle_node_takes_no_new_work() -> None:
    # z runs 1 s; node 0 is flagged at 10 s (held 1.5 h); a and b (one node each)
    # come at 100 s: a runs on node 1, b waits for it although node 0 is idle.
    m = _false_alarm(("z", 0, 1, 1), ("a", 100, 1000, 4), ("b", 100, 1000, 4))
    assert m["completed"] == 3
    assert m["mean_wait_s"] == pytest.approx(1000 / 3)  # z and a 0 s, b 1000 s
    pre = m["precursors"]
    assert pre["flags_false"] == 1 and pre["flags_true"] == 0
    # Node 0's 4 GPUs idle from 10 s to the last event at 2100 s, all of it while b
    # waited from 100 s to 1100 s.
    assert pre["gpu_hours_drained_idle"] == pytest.approx(4 * 2090 / 3600, abs=1e-5)
    assert pre["gpu_hours_drained_idle_false_alarms"] == pre["gpu_hours_drained_idle"]
    assert pre["gpu_hours_drained_idle_waiting"] == pytest.approx(4 * 1000 / 3600, abs=1e-5)


def test_a_false_alarm_costs_a_move_and_drained_capacity_but_loses_no_work() -> None:
    # a (one node, 7200 s) runs on node 0 from 0 s; a false alarm there at 1000 s: it
    # would not end before the failure expected at 4600 s, so it is checkpointed and
    # swapped onto node 1 (same rack), paying the 600 s restart and losing nothing.
    m = _false_alarm(("a", 0, 7200, 4), at=1000.0)
    pre = m["precursors"]
    assert pre["precaution_swaps"] == 1
    assert m["gpu_hours_lost"]["failures"] == 0
    assert pre["gpu_hours_precautions"] == pytest.approx(4 * 600 / 3600, abs=1e-5)
    assert m["mean_jct_s"] == 7200 + 600
    # Node 0 idle from 1000 s until the flag clears at 1000 + 5400 s.
    assert pre["gpu_hours_drained_idle"] == pytest.approx(4 * 5400 / 3600, abs=1e-5)


def test_a_job_that_ends_before_the_expected_failure_is_left_to_finish() -> None:
    # A false alarm on node 0 at 1000 s: the failure would be expected at 4600 s, a
    # ends at 2000 s, so it stays (no restart) and the node drains when it ends.
    m = _false_alarm(("a", 0, 2000, 4), at=1000.0)
    pre = m["precursors"]
    assert pre["precaution_swaps"] == pre["precaution_moves"] == pre["precaution_stayed"] == 0
    assert pre["gpu_hours_precautions"] == 0
    assert m["mean_jct_s"] == 2000


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 1000),
    share=st.sampled_from([0.25, 0.5, 1.0]),
    lead=st.sampled_from([600.0, 3600.0, 14400.0]),
    alarms=st.sampled_from([0.0, 0.02, 0.2]),
)
def test_drain_never_changes_the_failures_and_keeps_the_fleet_valid(
    seed: int, share: float, lead: float, alarms: float
) -> None:
    trace = _tracegen(120, racks=2, seed=seed)
    base = {"racks": 2, "node_mtbf_hours": 100.0, "check_invariants": True, "seed": seed}
    off, m_off = _failures(trace, SimConfig(**base))
    on, m_on = _failures(
        trace,
        SimConfig(**base, precursor_share=share, precursor_lead_s=lead, false_alarm_per_node_day=alarms),
    )
    n = min(len(off), len(on))
    assert off[:n] == on[:n]
    assert m_on["completed"] + m_on["rejected"] == m_off["completed"] + m_off["rejected"] == 120
    pre = m_on["precursors"]
    moves = pre["precaution_swaps"] + pre["precaution_moves"]
    assert pre["gpu_hours_precautions"] >= 0 and (moves > 0 or pre["gpu_hours_precautions"] == 0)
