"""Quota admission (placement.quota) and preemption at placement (placement.reclaim)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as S

from placement.model import Allocation, Fleet, JobRequest
from placement.place import place
from placement.quota import Ledger, Quota, fair_shares
from placement.reclaim import reclaim
from placement.testing import gang, occupy


def test_a_tenant_within_its_nominal_quota_is_admitted_even_when_borrowers_hold_the_pool():
    ledger = Ledger(4, 128, {"a": Quota(64), "b": Quota(64)}, {"a": 128})
    b = ledger.admit("b", 64)
    assert b.admitted and b.guaranteed and b.overdraw == 64
    assert ledger.reclaim_budgets() == {"a": 64}


def test_a_borrower_waits_with_the_numbers_when_the_cohort_has_nothing_to_lend():
    ledger = Ledger(
        4, 128, {"vision": Quota(64, borrowing_limit=32), "llm": Quota(64)}, {"vision": 64, "llm": 40}
    )
    over_limit = ledger.admit("vision", 64)
    assert not over_limit.admitted
    assert (
        over_limit.reason
        == "vision holds 64 of 64 nominal GPUs and may borrow 32: this job's 64 GPUs would borrow 64"
    )
    ledger.usage["llm"] = 64
    empty = ledger.admit("vision", 8)
    assert not empty.admitted and "the cohort has 0 GPUs to lend" in empty.reason


def test_without_quotas_the_fleet_is_one_pool_and_everyone_borrows():
    ledger = Ledger(4, 128)
    assert ledger.admit("anyone", 128).admitted
    ledger.take("anyone", 120)
    assert not ledger.admit("other", 16).admitted


def test_the_lending_limit_keeps_part_of_the_nominal_quota_for_its_tenant():
    ledger = Ledger(4, 128, {"a": Quota(64, lending_limit=16), "b": Quota(64)}, {})
    # b may use its own 64, plus a's lendable 16: never a's kept 48.
    assert ledger.admit("b", 80).admitted
    assert not ledger.admit("b", 81).admitted


@settings(max_examples=300, deadline=None)
@given(
    quotas=S.lists(
        S.tuples(S.integers(0, 64), S.none() | S.integers(0, 64), S.none() | S.integers(0, 64)),
        min_size=1,
        max_size=4,
    ),
    capacity=S.integers(0, 256),
    requests=S.lists(S.tuples(S.integers(0, 4), S.integers(1, 48)), max_size=30),
)
def test_admission_never_exceeds_a_ceiling_nor_lends_beyond_the_lending_limits(quotas, capacity, requests):
    """Whatever arrives: no tenant holds more than nominal + borrowing limit;
    other tenants use no GPUs of a tenant's kept part (the pool's draw stays
    within the pool, once each overdraw is reclaimed); and a reclaim takes only
    from tenants above their nominal quota."""
    ledger = Ledger(4, capacity, {f"t{i}": Quota(*q) for i, q in enumerate(quotas)})
    for who, gpus in requests:
        tenant = f"t{who}"
        decision = ledger.admit(tenant, gpus)
        if not decision.admitted:
            continue
        budgets = ledger.reclaim_budgets()
        ledger.take(tenant, gpus)
        # Reclaim the overdraw from the budgets, as the scheduler does.
        owed = decision.overdraw
        assert tenant not in budgets or not decision.guaranteed
        for victim, budget in sorted(budgets.items()):
            if owed <= 0:
                break
            assert ledger.usage[victim] > ledger.quota(victim).nominal, (
                "never a tenant within its nominal quota"
            )
            back = min(owed, budget)
            ledger.give(victim, back)
            owed -= back
        assert owed <= 0, "the borrowers hold at least the overdraw"
        for t, used in ledger.usage.items():
            ceiling = ledger.quota(t).ceiling
            assert ceiling is None or used <= ceiling
        assert ledger.draw() <= ledger.pool


# --- fair share ----------------------------------------------------------------------


def test_the_fair_share_is_the_nominal_quota_then_the_rest_by_weight_capped_by_demand():
    fair = fair_shares(128, {"a": 32, "b": 32, "c": 0}, {"a": 128, "b": 64, "c": 8}, {"a": 1, "b": 3, "c": 1})
    # Floors 32, 32, 0; the 64 left by weight 1:3:1 (12.8, 38.4, 12.8), c
    # capped at 8 and b at 64; what they leave goes to a.
    assert fair == pytest.approx({"a": 56.0, "b": 64.0, "c": 8.0})


@settings(max_examples=300, deadline=None)
@given(
    tenants=S.lists(
        S.tuples(S.integers(0, 64), S.integers(0, 128), S.integers(0, 64), S.sampled_from([0.5, 1, 2, 3])),
        min_size=1,
        max_size=4,
    ),
    extra=S.integers(0, 64),
    who=S.integers(0, 3),
    gpus=S.integers(1, 64),
)
def test_fair_shares_are_max_min_and_a_fair_reclaim_never_takes_anyone_below_its_share(
    tenants, extra, who, gpus
):
    """The fair shares: within the capacity and each demand, at least the
    nominal quota (up to demand), and max-min by weight: a tenant that gets
    less than it asks for gets at least as much above its floor, per weight, as
    any other. A fair-share reclaim happens only for a tenant within its share
    with the job, and takes nobody below its nominal quota or its share."""
    names = [f"t{i}" for i in range(len(tenants))]
    nominal = {t: n for t, (n, _, _, _) in zip(names, tenants, strict=True)}
    capacity = sum(nominal.values()) + extra
    ledger = Ledger(4, capacity, {t: Quota(n) for t, n in nominal.items()})
    for t, (_, held, _, _) in zip(names, tenants, strict=True):
        ledger.take(t, min(held, capacity))
    waiting = {t: w for t, (_, _, w, _) in zip(names, tenants, strict=True)}
    weight = {t: w for t, (_, _, _, w) in zip(names, tenants, strict=True)}
    fair = ledger.fair(waiting, weight)
    demand = {t: ledger.usage[t] + waiting[t] for t in names}
    floor = {t: min(nominal[t], demand[t]) for t in names}
    assert sum(fair.values()) <= capacity + 1e-6
    for t in names:
        assert floor[t] - 1e-6 <= fair[t] <= demand[t] + 1e-6
    short = [t for t in names if fair[t] < demand[t] - 1e-6]
    if short:
        assert sum(fair.values()) == pytest.approx(capacity), "nothing left idle while someone wants more"
    for t in short:
        for u in names:
            assert (fair[t] - floor[t]) / weight[t] >= (fair[u] - floor[u]) / weight[u] - 1e-6

    tenant = names[who % len(names)]
    found = ledger.fair_reclaim(tenant, gpus, fair)
    ledger.take(tenant, gpus)  # a job admitted in the same pass is in the usage already
    assert ledger.fair_reclaim(tenant, gpus, fair, counted=True) == found
    ledger.give(tenant, gpus)
    if ledger.usage[tenant] + gpus > fair[tenant] + 1e-6:
        assert found is None
        return
    assert found is not None
    budgets, need = found
    assert tenant not in budgets
    assert need == max(0, ledger.draw({**ledger.usage, tenant: ledger.usage[tenant] + gpus}) - ledger.pool)
    for t, budget in budgets.items():
        left = ledger.usage[t] - budget
        assert budget > 0 and left >= nominal[t] and left >= fair[t] - 0.5


# --- reclaim -----------------------------------------------------------------------


def _fleet() -> Fleet:
    return Fleet.uniform(3, 18, 4, spare_nodes=0)


def _borrowed(fleet: Fleet) -> None:
    """Tenant a fills the fleet with 4-node jobs (borrowed), started at different times."""
    for r in range(3):
        for k in range(4):
            occupy(fleet, f"a{r}{k}", r, list(range(4 * k, 4 * k + 4)), tenant="a", checkpoint_minutes=60)
        occupy(fleet, f"a{r}x", r, [16, 17], tenant="a", checkpoint_minutes=60)


def test_a_reclaim_frees_one_rack_for_a_16_node_gang_at_the_least_cost():
    fleet = _fleet()
    _borrowed(fleet)
    # Rack 1's jobs checkpointed just now: the cheapest to stop.
    for vid, alloc in fleet.allocations.items():
        alloc.started_at = 0.0 if vid.startswith("a1") else 1000.0
    job = gang("b1", 16, "required", tenant="b")
    plan = reclaim(fleet, job, lambda v: v.tenant == "a", {"a": 10_000}, now=3600.0)
    assert plan.placed, plan.reason
    assert {fleet.nodes[n].rack for n in plan.placement.nodes} == {fleet.racks[1].id}
    assert sorted(plan.victims) == ["a10", "a11", "a12", "a13"], "the 2-node job is not needed"
    before = {k: v.job.id for k, v in fleet.allocations.items()}
    assert before == {k: k for k in before}, "the fleet is left as it was"


def test_a_reclaim_takes_nothing_from_a_tenant_within_its_nominal_quota():
    fleet = _fleet()
    _borrowed(fleet)
    plan = reclaim(fleet, gang("b1", 16, "required", tenant="b"), lambda v: v.tenant == "a", {"a": 15 * 4})
    assert not plan.placed, "a may lose 60 GPUs only: 15 nodes, one short of the gang"


def _small_fleets():
    return S.tuples(S.integers(1, 2), S.integers(2, 5), S.lists(S.integers(1, 3), min_size=1, max_size=8))


@settings(max_examples=120, deadline=None)
@given(shape=_small_fleets(), need=S.integers(1, 6), data=S.data())
def test_reclaim_finds_room_whenever_some_set_of_victims_makes_it_and_stops_none_it_does_not_need(
    shape, need, data
):
    """Oracle: every subset of the running jobs. If stopping some subset lets
    the job start, reclaim finds a set; each of its victims is needed (giving
    any one back leaves no room); and its cost is no more than twice the
    cheapest working subset's."""
    racks, size, jobs = shape
    fleet = Fleet.uniform(racks, size, 4, spare_nodes=0)
    slot = {r: 0 for r in range(racks)}
    for i, width in enumerate(jobs):
        r = data.draw(S.integers(0, racks - 1))
        if slot[r] + width <= size:
            occupy(fleet, f"v{i}", r, list(range(slot[r], slot[r] + width)), checkpoint_minutes=60 + i)
            slot[r] += width
    job = gang("w", min(need, racks * size), "required")
    plan = reclaim(fleet, job, lambda v: True, {})
    costs = {v: a.gpus * (a.job.checkpoint_minutes / 2 + 10) / 60 for v, a in fleet.allocations.items()}
    best = None
    for k in range(len(costs) + 1):
        for subset in itertools.combinations(sorted(costs), k):
            with fleet.trial():
                for v in subset:
                    fleet.release(v)
                if place(fleet, job).placed:
                    cost = sum(costs[v] for v in subset)
                    best = cost if best is None else min(best, cost)
    assert plan.placed == (best is not None)
    if not plan.placed:
        return
    assert plan.cost_gpu_hours <= 2 * best + 1e-9
    for v in plan.victims:
        with fleet.trial():
            for other in plan.victims:
                if other != v:
                    fleet.release(other)
            assert not place(fleet, job).placed, f"{v} was not needed"


def _small(fleet: Fleet, jid: str, rack: int, slot: int, gpus: int, **kw: object) -> None:
    """A job of ``gpus`` GPUs on the next free GPUs of one node."""
    node = fleet.node_at(fleet.racks[rack].id, slot)
    taken = {g for a in fleet.allocations.values() for g in a.nodes.get(node.id, ())}
    free = [g for g in range(fleet.racks[rack].gpus_per_node) if g not in taken][:gpus]
    job = JobRequest(jid, num_gpus=gpus, **kw)  # type: ignore[arg-type]
    fleet.allocate(Allocation(job, {node.id: tuple(free)}, [[node.id]]))


def test_a_reclaim_frees_whole_nodes_within_a_tenants_budget():
    """itp01 x1 (seed 1) traced: a 16-node gang of a tenant under its quota waited
    57 minutes with 15 idle nodes in a rack, because the cheapest victims first
    spent the borrower's 4-GPU budget on nodes that stayed busy; stopping the one
    job on the 16th node was within it."""
    fleet = Fleet.uniform(1, 18, 4, spare_nodes=0)
    for k in range(3):  # the cheapest alternate between nodes 14 and 15
        for slot, minutes in ((14, 10 + 20 * k), (15, 20 + 20 * k)):
            _small(fleet, f"d{slot}-{k}", 0, slot, 1, tenant="d", checkpoint_minutes=minutes)
    _small(fleet, "d6", 0, 6, 1, tenant="d", checkpoint_minutes=600)
    plan = reclaim(fleet, gang("a1", 16, "required", tenant="a"), lambda v: v.tenant == "d", {"d": 4})
    assert plan.placed, plan.reason
    assert plan.victims == ["d14-0", "d14-1", "d14-2"], "node 14 is the cheapest node to free"


@settings(max_examples=200, deadline=None)
@given(
    size=S.integers(2, 5),
    jobs=S.lists(S.tuples(S.sampled_from("ab"), S.integers(1, 4), S.integers(0, 4)), min_size=1, max_size=9),
    limits=S.fixed_dictionaries({"a": S.integers(0, 12), "b": S.integers(0, 12)}),
    need=S.integers(1, 5),
)
def test_reclaim_within_budgets_finds_room_whenever_some_set_of_victims_within_them_makes_it(
    size, jobs, limits, need
):
    """Oracle: every subset of the running jobs that takes no tenant past its
    budget. If one lets the gang start, reclaim finds a set within the budgets."""
    fleet = Fleet.uniform(1, size, 4, spare_nodes=0)
    for i, (tenant, gpus, slot) in enumerate(jobs):
        node = fleet.node_at(fleet.racks[0].id, slot % size)
        if node.free_gpus >= gpus:
            _small(fleet, f"v{i}", 0, slot % size, gpus, tenant=tenant, checkpoint_minutes=30 + 7 * i)
    job = gang("w", min(need, size), "required", tenant="c")
    plan = reclaim(fleet, job, lambda v: True, limits)
    gpus = {v: (a.job.tenant, a.gpus) for v, a in fleet.allocations.items()}
    found = False
    for k in range(len(gpus) + 1):
        for subset in itertools.combinations(sorted(gpus), k):
            if any(sum(gpus[v][1] for v in subset if gpus[v][0] == t) > limits[t] for t in limits):
                continue
            with fleet.trial():
                for v in subset:
                    fleet.release(v)
                found = found or place(fleet, job).placed
    assert plan.placed == found, plan.reason
    for t in limits:
        assert sum(gpus[v][1] for v in plan.victims if gpus[v][0] == t) <= limits[t]
