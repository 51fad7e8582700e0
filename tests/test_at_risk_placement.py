"""Placement uses health (issue #31): a node whose GPU a rule marks suspect (a
hardware slowdown, a rising error rate below the drain threshold) is at risk;
gangs take other idle nodes first, and the node is an ordinary one again once
its agent's reading clears. Through heartbeats and the scheduling pass, with
the in-memory fleet checked against the rows after every pass."""

from __future__ import annotations

import pytest

from fleet import engine
from fleet.choices import GpuHealth, NodeState
from fleet.models import GPU, Node
from fleet.services.decisions.scheduling import schedule_pass
from fleet.services.jobs.submit import JobSpec, submit_job
from tests.signals_support import send_beat
from tests.support import nodes_of

pytestmark = pytest.mark.django_db


def _hosts(job_id: int) -> set[str]:
    return set(Node.objects.filter(pk__in=nodes_of(job_id)).values_list("hostname", flat=True))


def _gang(submitter, name: str) -> int:
    spec = JobSpec(name=name, tenant="llm", num_nodes=8, gpus_per_node=4, locality="required")
    return submit_job(submitter, spec).pk


def test_a_gang_keeps_off_nodes_whose_gpus_slow_down_until_they_clear(
    fleet, submitter, default_health_rules, django_capture_on_commit_callbacks
):
    schedule_pass()  # the scheduler's fleet in memory before the readings come
    risky = ["r1-n00", "r1-n01", "r1-n02"]
    with django_capture_on_commit_callbacks(execute=True):
        for host in risky:
            send_beat(host, clock_event_reasons=["hw_slowdown"])
    assert GPU.objects.filter(node__hostname="r1-n00", health=GpuHealth.DEGRADED).count() == 4
    assert Node.objects.get(hostname="r1-n00").state == NodeState.HEALTHY, "suspect: still takes work"
    with engine.live_snapshot() as snap:
        r1 = next(r for r in snap.fleet.racks if r.name == "r1")
        assert r1.at_risk == {0, 1, 2}

    first = _gang(submitter, "first")
    schedule_pass()
    assert _hosts(first) == {f"r1-n{i:02d}" for i in range(3, 11)}

    # The readings clear: the nodes are ordinary again.
    with django_capture_on_commit_callbacks(execute=True):
        for host in risky:
            send_beat(host)
    with engine.live_snapshot() as snap:
        assert next(r for r in snap.fleet.racks if r.name == "r1").at_risk == set()
    schedule_pass()  # and the fleet in memory still equals the rows
