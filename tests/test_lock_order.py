"""Lock order between job and node services, on real PostgreSQL connections.

Node services lock a node and then the jobs on it (failing a node interrupts its
jobs). A job's release must therefore never wait for a node row: when a job on a
draining node finishes while another transaction holds that node (a heartbeat,
a failure), the release skips the node instead of closing a deadlock cycle, and
reconcile settles it afterwards. (The settling is the node lifecycle's, in a transaction
of its own once the job's commits.)"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from fleet.choices import NodeState
from fleet.models import Node
from fleet.services.jobs import allocations as job_allocations
from fleet.services.jobs import submit as job_services
from fleet.services.nodes import lifecycle as node_lifecycle
from fleet.services.nodes import moves as node_services
from fleet.tasks import reconcile_once

pytestmark = pytest.mark.django_db(transaction=True)


def _running_job_on(node: Node, owner) -> int:
    job = job_services.submit_job(owner, job_services.JobSpec(name="train", num_gpus=4))
    job_allocations.apply_placement(None, job.pk, {node.pk: [0, 1, 2, 3]}, reason="test")
    job_allocations.start_job(None, job.pk)
    return job.pk


def test_a_job_finishing_on_a_draining_node_another_transaction_holds_does_not_wait(
    fleet, submitter, operator
):
    node = fleet[0].nodes.get(slot=5)
    job_id = _running_job_on(node, submitter)
    node_services.drain_node(operator, node.pk, "maintenance")
    holding, finished = threading.Event(), threading.Event()
    outcome: dict[str, bool] = {}

    def hold_the_node() -> None:
        # What a heartbeat or a failure does first: lock the node row.
        try:
            with transaction.atomic():
                Node.objects.select_for_update().get(pk=node.pk)
                holding.set()
                outcome["finished_while_held"] = finished.wait(timeout=10)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_node)
    holder.start()
    assert holding.wait(timeout=10)
    job_allocations.finish_job(None, job_id, succeeded=True)
    finished.set()
    holder.join()

    assert outcome["finished_while_held"]  # the release did not wait for the node
    node.refresh_from_db()
    assert node.state == NodeState.DRAINING  # skipped while held...

    reconciled = reconcile_once()

    node.refresh_from_db()
    assert node.state == NodeState.DRAINED  # ...and settled by reconcile
    assert reconciled["drained"] == [node.pk]


def test_a_job_finishing_on_a_free_draining_node_drains_it_at_once(fleet, submitter, operator):
    node = fleet[0].nodes.get(slot=6)
    job_id = _running_job_on(node, submitter)
    node_services.drain_node(operator, node.pk, "maintenance")

    job_allocations.finish_job(None, job_id, succeeded=True)

    node.refresh_from_db()
    assert node.state == NodeState.DRAINED
    assert node_lifecycle.settle_drained_nodes() == []
