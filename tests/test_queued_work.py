"""Queued work does not multiply under a burst (#28 item 14): reconcile sends an
approved action's execution once however often it runs, a burst of job ends
costs a few cluster syncs rather than one each, and failure detection and
reconcile have a queue of their own, never behind bulk work."""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from fleet import dispatch, locks
from fleet.models import Action
from fleet.tasks import reconcile_once, sync_cluster
from rackwise.celery import app
from tests.support import flush_broker

pytestmark = pytest.mark.django_db(transaction=True)


def queued(queue: str = "celery") -> Counter:
    """The tasks waiting in a broker queue (no worker runs in these tests)."""
    r = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    return Counter(json.loads(m)["headers"]["task"] for m in r.lrange(queue, 0, -1))


def test_reconcile_sends_an_approved_actions_execution_once_however_often_it_runs(
    fragmented, operator_client
):
    flush_broker()
    plan = operator_client.post("/api/actions/defrag/", {}, format="json").json()
    assert operator_client.post(f"/api/actions/{plan['id']}/approve/", {}, format="json").status_code == 200
    assert queued()["fleet.tasks.execute_action"] == 1
    Action.objects.filter(pk=plan["id"]).update(updated_at=timezone.now() - timedelta(seconds=30))

    for _ in range(3):
        reconcile_once()

    # Three passes found it approved and idle; the first message still waits.
    assert queued()["fleet.tasks.execute_action"] == 1
    # Once a worker takes the message, the next pass may send it again.
    dispatch.taken("fleet.tasks.execute_action", plan["id"])
    assert plan["id"] in reconcile_once()["executing"]
    assert queued()["fleet.tasks.execute_action"] == 2


def test_a_burst_of_job_ends_costs_one_sync_message_per_second_not_one_each(db):
    flush_broker()
    with transaction.atomic():
        for _ in range(50):
            dispatch.sync_cluster_in(0.2)
    assert 1 <= queued()["fleet.tasks.sync_cluster"] <= 2  # 2 if the burst straddled a second


def test_a_sync_asked_for_before_one_began_is_answered_by_it(db):
    flush_broker()
    asked = time.time()
    first = sync_cluster(asked_at=asked)
    assert "skipped" not in first and "jobs" in first
    assert sync_cluster(asked_at=asked) == {"skipped": "a sync begun since it was asked for has answered it"}
    assert "jobs" in sync_cluster(asked_at=time.time() + 0.001)  # asked for after: it syncs again


def test_a_sync_asked_for_while_one_runs_is_left_to_it(db):
    flush_broker()
    with locks.held(locks.SYNC_LOCK, ttl=10, wait=None):
        assert "another worker is syncing" in sync_cluster()["skipped"]
    # The request it left behind makes the running sync go round again.
    assert redis.Redis.from_url(settings.REDIS_URL).get(locks.SYNC_DIRTY)


@pytest.mark.parametrize("task", ["fleet.tasks.detect_failures", "fleet.tasks.reconcile"])
def test_failure_detection_and_reconcile_have_their_own_queue(task):
    assert app.amqp.router.route({}, task)["queue"].name == "control"
