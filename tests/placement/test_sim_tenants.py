"""A shared fleet in the simulator: tenants on traces, quota figures, reclaim, baselines."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.model import REQUIRED, JobRequest
from placement.sim.simulation import SimConfig, simulate
from placement.sim.tenancy import Tenancy
from placement.sim.tenants import TenantSetup, assign, gpu_hour_shares, quotas
from placement.sim.trace import TraceJob

TWO = TenantSetup(entitlements=(("a", 0.5), ("b", 0.5)))


def job(jid: str, tenant: str, gpus: int, submit: float, duration: float, priority: int = 0) -> TraceJob:
    req = JobRequest(
        id=jid,
        num_gpus=gpus,
        locality=REQUIRED,
        priority=priority,
        tenant=tenant,
        checkpoint_minutes=30,
        submit_time=submit,
        expected_duration=duration,
    )
    return TraceJob(req, submit, duration, 0)


def small_fleet(tenants: TenantSetup | None, nodes: int = 2, racks: int = 1) -> SimConfig:
    return SimConfig(
        racks=racks,
        nodes_per_rack=nodes,
        gpus_per_node=4,
        spare_nodes=0,
        node_mtbf_hours=0,
        checkpoint_minutes=30,
        tenants=tenants,
        check_invariants=True,
    )


def synthetic(n: int = 3000, seed: int = 1) -> list[TraceJob]:
    rng = random.Random(seed)
    t = 0.0
    out = []
    for i in range(n):
        t += rng.expovariate(1 / 60)
        out.append(job(f"j{i}", "", rng.choice([1, 2, 4, 8, 16, 64]), t, rng.uniform(60, 20000)))
    return out


# -- tenants on traces ---------------------------------------------------------------------


def test_assignment_is_deterministic_and_keeps_the_shares() -> None:
    trace = synthetic()
    one, two = assign(trace, seed=3), assign(trace, seed=3)
    assert [t.job.tenant for t in one] == [t.job.tenant for t in two]
    assert [t.job.id for t in one] == [t.job.id for t in trace]
    shares = gpu_hour_shares(one)
    for name, target in (("a", 0.5), ("b", 0.3), ("c", 0.15), ("d", 0.05)):
        assert abs(shares[name] - target) < 0.03, shares
    other = assign(trace, seed=4)
    assert [t.job.tenant for t in one] != [t.job.tenant for t in other]


def test_assignment_comes_in_bursts() -> None:
    tagged = assign(synthetic(), seed=0, bursts=100, checkpoint_minutes=15)
    switches = sum(1 for x, y in itertools.pairwise(tagged) if x.job.tenant != y.job.tenant)
    assert switches <= 100  # at most one switch per burst
    assert all(t.job.checkpoint_minutes == 15 for t in tagged)


def test_quotas_are_whole_nodes_within_the_fleet() -> None:
    qs = quotas(TenantSetup(), 288, 4)
    assert [q.nominal for q in qs.values()] == [144, 84, 40, 12]
    assert all(q.nominal % 4 == 0 and q.borrowing_limit is None for q in qs.values())
    assert sum(q.nominal for q in qs.values()) <= 288


# -- the figures on hand-made states -------------------------------------------------------


def test_entitlement_is_nominal_then_leftover_by_weight() -> None:
    ten = Tenancy(TWO, 8, 4, "rackwise")
    ten.enqueued(JobRequest("x", num_gpus=8, tenant="a"))
    ten.enqueued(JobRequest("y", num_gpus=2, tenant="b"))
    assert ten.entitled() == {"a": 6.0, "b": 2.0}


def test_share_error_time_to_guaranteed_and_jain_known_answer() -> None:
    ten = Tenancy(TWO, 8, 4, "rackwise")
    a = JobRequest("a1", num_gpus=8, tenant="a")
    b = JobRequest("b1", num_gpus=4, tenant="b")
    ten.advance(0.0)
    ten.started(a, 8)
    ten.enqueued(b)
    ten.observe(0.0)  # b holds 0 of its 4 and has a 4-GPU job queued: owed
    ten.advance(100.0)  # a held 8 (entitled 4), b 0 (entitled 4): error 8 GPUs x 100 s
    ten.stopped(a, 8)
    ten.dequeued(b)
    ten.started(b, 4)
    ten.observe(100.0)
    ten.advance(200.0)  # b holds its 4, a wants nothing: no error
    rep = ten.report(lost_preemption_gs=3600.0)
    assert rep["share_error"] == pytest.approx(800 / (8 * 200))
    assert rep["time_to_guaranteed_p95_s"] == 100.0
    assert rep["guaranteed_episodes"] == 1
    # a held 800 of 400 entitled GPU-s (2.0), b 400 of 800 (0.5).
    assert rep["jain_index"] == pytest.approx(2.5**2 / (2 * (4 + 0.25)))
    assert rep["gpu_hours_lost_preemption"] == 1.0


@pytest.mark.parametrize("policy", ["rackwise", "kueue-tas", "slurm-block"])
def test_a_tenant_under_nominal_reclaims_from_a_borrower(policy: str) -> None:
    # a borrows the whole 8-GPU fleet; b (nominal 4) arrives at t=100 and takes its
    # share back at once; a loses its 100 s since the start (no checkpoint yet) and
    # pays the 10-minute restart when it runs again.
    trace = [job("a1", "a", 8, 0, 1000), job("b1", "b", 4, 100, 100)]
    res = simulate(trace, policy, small_fleet(TWO))
    ten = res.metrics["tenants"]
    assert ten["preemptions"] == 1
    assert ten["gpu_hours_lost_preemption"] == pytest.approx(8 * (100 + 600) / 3600, abs=1e-4)
    assert ten["gpu_hours_preempted"] == pytest.approx(8 * 100 / 3600, abs=1e-4)
    assert ten["guaranteed_episodes"] == 0  # b never waited
    assert ten["victims_at_or_under_nominal"] == 0
    assert res.metrics["completed"] == 2


def test_without_tenants_nothing_is_preempted() -> None:
    trace = [job("a1", "a", 8, 0, 1000), job("b1", "b", 4, 100, 100)]
    res = simulate(trace, "rackwise", small_fleet(None))
    assert "tenants" not in res.metrics
    assert res.metrics["requeues"] == 0
    assert res.metrics["p95_wait_s"] == 900.0  # b waits for a to finish


# -- baselines follow their cited rules ----------------------------------------------------

THREE = TenantSetup(entitlements=(("a", 0.5), ("b", 0.25), ("c", 0.25)))


def test_kueue_reclaim_preempts_only_borrowing_queues() -> None:
    # 16 GPUs: nominal a 8, b 4, c 4. a runs 8 (at nominal), c runs 8 (borrows 4),
    # c's last job is the most recently admitted. b's 4-GPU job reclaims from c only.
    trace = [
        job("a1", "a", 4, 0, 5000),
        job("a2", "a", 4, 0, 5000),
        job("c1", "c", 4, 1, 5000),
        job("c2", "c", 4, 2, 5000),
        job("b1", "b", 4, 100, 100),
    ]
    res = simulate(trace, "kueue-tas", small_fleet(THREE, nodes=4))
    assert res.metrics["tenants"]["preemptions"] == 1
    started = _first_starts(trace, "kueue-tas", small_fleet(THREE, nodes=4))
    assert started["b1"] == 100
    assert started["a1"] == started["a2"] == 0


def test_slurm_grptres_caps_a_tenant_at_nominal_plus_borrowing_limit() -> None:
    capped = TenantSetup(entitlements=(("a", 0.5), ("b", 0.5)), borrowing_limit=0)
    trace = [job(f"a{i}", "a", 4, 0, 1000) for i in range(4)]
    starts = _first_starts(trace, "slurm-block", small_fleet(capped, nodes=4))
    # 16 idle GPUs, but a's nominal is 8 and it may borrow none: two at a time.
    assert sorted(starts.values()) == [0, 0, 1000, 1000]


def test_slurm_preempts_only_the_borrow_partition() -> None:
    # a: 8 GPUs in guaranteed (its nominal), then 8 more in borrow; b's job preempts
    # a job of the borrow partition, never one of a's guaranteed ones.
    trace = [
        job("a1", "a", 8, 0, 5000),
        job("a2", "a", 8, 1, 5000),
        job("b1", "b", 4, 100, 100),
    ]
    sim_cfg = small_fleet(TWO, nodes=4)
    starts = _first_starts(trace, "slurm-block", sim_cfg)
    res = simulate(trace, "slurm-block", sim_cfg)
    assert res.metrics["tenants"]["preemptions"] == 1
    assert starts["b1"] == 100 and starts["a1"] == 0


def _first_starts(trace: list[TraceJob], policy: str, cfg: SimConfig) -> dict[str, float]:
    from placement.sim.simulation import Simulation

    sim = Simulation(trace, policy, cfg)
    sim.run()
    return {jid: s.first_start for jid, s in sim.jobs.items() if s.first_start is not None}


def test_rackwise_reclaims_for_a_borrower_within_its_fair_share_from_one_rack() -> None:
    # 32 GPUs in two racks of 4 nodes; nominal a 12, b 12, c 4 (weights 2:2:1), 4
    # GPUs nobody's. a borrows the whole fleet in 1-node jobs. c asks for nothing,
    # so the 8 GPUs beyond a's and b's quotas are shared by their weights: b's fair
    # share is 16, and its 16-GPU gang, though beyond its nominal 12, takes back
    # one rack of a's work at once; a keeps its fair share (16). Slurm's
    # partition_prio preempts only for the guaranteed partition: b waits there.
    setup = TenantSetup(entitlements=(("a", 0.4), ("b", 0.4), ("c", 0.2)))
    trace = [job(f"a{i}", "a", 4, 0, 10000) for i in range(8)] + [job("b1", "b", 16, 100, 100)]
    cfg = small_fleet(setup, nodes=4, racks=2)
    starts = _first_starts(trace, "rackwise", cfg)
    assert starts["b1"] == 100
    res = simulate(trace, "rackwise", cfg)
    assert res.metrics["tenants"]["preemptions"] == 4
    assert res.metrics["tenants"]["victims_at_or_under_nominal"] == 0
    assert _first_starts(trace, "slurm-block", cfg)["b1"] >= 10000


def test_slurm_restarted_victim_was_in_borrow() -> None:
    trace = [
        job("a1", "a", 8, 0, 5000),
        job("a2", "a", 8, 1, 5000),
        job("b1", "b", 4, 100, 100),
    ]
    from placement.sim.simulation import Simulation

    sim = Simulation(trace, "slurm-block", small_fleet(TWO, nodes=4))
    sim.run()
    assert sim.jobs["a1"].restarts == 0 and sim.jobs["a2"].restarts == 1


# -- invariants ----------------------------------------------------------------------------

jobs_st = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from([1, 2, 4, 8, 16, 32]),
        st.integers(0, 20000),
        st.integers(60, 10000),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=40, deadline=None)
@given(
    rows=jobs_st, policy=st.sampled_from(["rackwise", "kueue-tas", "slurm-block"]), spares=st.integers(0, 1)
)
def test_reclaim_never_preempts_a_tenant_at_or_under_nominal(
    rows: list[tuple[str, int, int, int]], policy: str, spares: int
) -> None:
    """check_invariants asserts, after every instant, that the tenants' GPUs equal the
    fleet's, never above capacity, and that no rackwise victim's tenant was at or
    under its nominal quota."""
    trace = sorted((job(f"j{i}", t, g, s, d) for i, (t, g, s, d) in enumerate(rows)), key=lambda x: x.submit)
    cfg = small_fleet(THREE, nodes=4, racks=2)
    cfg.spare_nodes = spares
    res = simulate(trace, policy, cfg)
    ten = res.metrics["tenants"]
    assert ten["victims_at_or_under_nominal"] == 0
    assert res.metrics["completed"] + res.metrics["rejected"] == len(trace)
    assert 0.0 <= ten["share_error"] <= 1.0 + 1e-9


@pytest.mark.parametrize(("bound", "first"), [(2.0, "a1"), (None, "b1")], ids=["bound", "no-bound"])
def test_an_overdue_job_goes_ahead_of_a_lower_share_tenants_job(bound, first) -> None:
    """The starvation bound (Tenancy.overdue): a borrowing job that has waited as long
    as it will run (4 h for a 2 h job, past the 1 h floor) goes ahead of another
    tenant's newer job, though fair share alone would put that one first."""
    from placement.sim.simulation import Simulation
    from placement.sim.state import JobState

    trace = [job("a1", "a", 16, 0, 2 * 3600), job("b1", "b", 16, 3 * 3600, 2 * 3600)]
    setup = dataclasses.replace(TWO, overdue_slowdown=bound)
    sim = Simulation(trace, "rackwise", small_fleet(setup, nodes=4))
    assert sim.tenancy is not None
    sim.tenancy.decayed["a"] = 1e6  # a used far more lately: b's share is the better
    pending = [JobState(t.job, t.submit, t.duration, (t.submit, 0, i)) for i, t in enumerate(trace)]
    order = sim._tenant_order(pending, 4 * 3600, lambda st: (st.order,))
    assert order[0].job.id == first
    if bound is not None:
        assert not sim.tenancy.overdue(waited=3599, run=3600), "not before it waited as long as it runs"


@pytest.mark.parametrize(("order", "first"), [("entitled", "a1"), ("share", "b1")])
def test_a_job_within_its_tenants_fair_share_goes_ahead_of_one_beyond_it(order, first) -> None:
    """32 GPUs, nominal a 12, b 12, c 4 (weights 2:2:1), c asks for nothing. a
    holds its 12 and asks for 4 more, b asks for 20: the 8 GPUs left are shared
    by weight, so both are entitled to 16; a's job keeps a within (16), b's would
    take b beyond (20). a used far more lately, so by fair share alone (the order
    before) b's job came first, started, and was the cheapest victim of a's
    fair-share reclaim at the next pass."""
    from placement.sim.simulation import Simulation
    from placement.sim.state import JobState

    setup = TenantSetup(entitlements=(("a", 0.4), ("b", 0.4), ("c", 0.2)))
    trace = [job("a1", "a", 4, 0, 3600), job("b1", "b", 20, 0, 3600)]
    cfg = dataclasses.replace(small_fleet(setup, nodes=4, racks=2), rackwise_tenant_order=order)
    sim = Simulation(trace, "rackwise", cfg)
    ten = sim.tenancy
    assert ten is not None
    ten.ledger.take("a", 12)
    ten.decayed["a"] = 1e6
    pending = [JobState(t.job, t.submit, t.duration, (t.submit, 0, i)) for i, t in enumerate(trace)]
    for state in pending:
        ten.enqueued(state.job)
    assert ten.entitled()["a"] == ten.entitled()["b"] == 16
    assert sim._tenant_order(pending, 60, lambda s: (s.order,))[0].job.id == first


_REPLAY = """
import json
from placement.sim.simulation import SimConfig, simulate
from placement.sim.tenants import TenantSetup, assign
from placement.sim.tenancy import Tenancy
from tests.placement.test_sim_tenants import synthetic
cfg = SimConfig(racks=2, nodes_per_rack=8, gpus_per_node=4, spare_nodes=0, node_mtbf_hours=0,
                checkpoint_minutes=30, tenants=TenantSetup())
res = simulate(assign(synthetic(600), seed=0), "rackwise", cfg)
ten = Tenancy(TenantSetup(), 64, 4, "rackwise")
for name, gpus in (("a", 40), ("b", 12), ("c", 7), ("d", 3)):
    ten.queued_gpus[name] = gpus
print(json.dumps([res.fingerprint, res.metrics["tenants"], ten.entitled()]))
"""


def test_a_tenants_replay_does_not_depend_on_the_hash_seed() -> None:
    """The fair shares sum over the tenants in one order (sorted), so a replay and its
    figures are the same in every process, whatever PYTHONHASHSEED gives set order."""
    import os
    import subprocess
    import sys

    out = []
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", _REPLAY], env=env, capture_output=True, text=True, check=True
        )
        out.append(done.stdout)
    assert out[0] == out[1] == out[2]
