"""Health on the live stack (issue #31), as operators see it: node agents report
through the API, real Celery workers schedule and carry out the steps on the
simulated cluster.

- A rack whose nodes report a degraded NVLink fabric gets no new gang from the
  next pass on, tops the attention view, and its long gang is proposed a move.
- A node a health rule drains takes no new work and is drained when its jobs end.
"""

from __future__ import annotations

import pytest

from fleet.choices import ActionKind, JobState, NodeState
from fleet.models import Action, Job, Node, Rack
from tests.signals_support import send_beat
from tests.support import consistent_violations, nodes_of, wait_for, workers

pytestmark = pytest.mark.django_db(transaction=True)


def _submit(client, name: str, **shape) -> int:
    body = {"name": name, "tenant": "llm", "expected_duration_s": 10**6, **shape}
    response = client.post("/api/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def _running(*job_ids: int, timeout: float = 40) -> None:
    wait_for(
        lambda: Job.objects.filter(pk__in=job_ids, state=JobState.RUNNING).count() == len(job_ids),
        timeout,
        f"jobs {job_ids} to run",
    )


def _racks(job_id: int) -> set[str]:
    return set(Node.objects.filter(pk__in=nodes_of(job_id)).values_list("rack__name", flat=True))


def test_a_degraded_rack_gets_no_new_gang_tops_attention_and_its_long_gang_is_proposed_a_move(
    fleet, default_health_rules, submitter_client, viewer_client
):
    with workers(1):
        old = _submit(submitter_client, "old", num_nodes=8, gpus_per_node=4, locality="required")
        _running(old)
        [bad] = _racks(old)
        good = ({"r1", "r2"} - {bad}).pop()

        # Two of its nodes' agents report fabric trouble: the rack is degraded.
        first, second = Node.objects.filter(rack__name=bad).order_by("slot")[:2]
        send_beat(first.hostname, imex="unavailable")
        send_beat(second.hostname, fabric__health_mask=2)
        assert Rack.objects.get(name=bad).fabric_degraded.startswith(
            "NVLink fabric degraded on 2 of 18 nodes"
        )
        attention = viewer_client.get("/api/attention/").json()
        assert attention["items"][0]["key"] == "racks_degraded", attention["items"]
        assert f"({bad})" in attention["items"][0]["text"]

        # The worker proposed moving the long gang off, to the healthy rack.
        proposal = wait_for(
            lambda: Action.objects.filter(kind=ActionKind.EVACUATION, jobs=old).first(), 30, "an evacuation"
        )
        assert proposal.title == f"move job #{old} old off {bad} (NVLink fabric degraded) to {good}"

        # New gangs: the healthy rack takes two, the third waits rather than use the degraded one.
        gangs = [
            _submit(submitter_client, f"g{i}", num_nodes=8, gpus_per_node=4, locality="required")
            for i in range(3)
        ]
        wait_for(
            lambda: (
                Job.objects.filter(pk__in=gangs, state=JobState.RUNNING).count() == 2
                and "NVLink fabric degraded"
                in Job.objects.filter(pk__in=gangs, state=JobState.PENDING).get().state_reason
            ),
            40,
            "two gangs to run and one to wait",
        )
        for g in gangs:
            assert _racks(g) in (set(), {good}), (g, _racks(g))
        # One-node work may still use the degraded rack's idle nodes (the healthy
        # rack has its two spares left, lent to one-node work).
        ones = [_submit(submitter_client, f"one{i}", num_nodes=1, gpus_per_node=4) for i in range(3)]
        _running(*ones)
        assert bad in set().union(*(_racks(o) for o in ones))
    assert consistent_violations() == []


def test_a_node_a_rule_drains_takes_no_new_work_and_is_drained_when_its_jobs_end(
    fleet, default_health_rules, submitter_client
):
    with workers(1):
        # Two one-GPU jobs share a node (tightest fit keeps idle nodes whole)...
        a = _submit(submitter_client, "a", num_gpus=1, expected_duration_s=3000)
        _running(a)
        b = _submit(submitter_client, "b", num_gpus=1, expected_duration_s=3000)
        _running(b)
        [node_id] = nodes_of(a)
        assert nodes_of(b) == {node_id}, "the control: the next small job packs onto the same node"
        node = Node.objects.get(pk=node_id)

        # ...until its agent reports a pending row remap: drain after the jobs.
        send_beat(node.hostname, remapped_rows__pending=True)
        node.refresh_from_db()
        assert node.state == NodeState.DRAINING, node.state
        c = _submit(submitter_client, "c", num_gpus=1, expected_duration_s=3000)
        _running(c)
        assert nodes_of(c) != {node_id}, "no new work on a node drained by a rule"

        # The simulated cluster ends a and b after 30 s (3,000 s at 1/100): drained.
        wait_for(
            lambda: Node.objects.get(pk=node_id).state == NodeState.DRAINED, 60, "the node to settle drained"
        )
        assert Job.objects.get(pk=a).state == JobState.COMPLETED
    assert consistent_violations() == []
