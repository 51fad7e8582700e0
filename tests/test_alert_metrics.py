"""The series deploy/prometheus/rackwise-alerts.yml alerts on that /metrics
added for it: how long the oldest proposal has waited, webhook deliveries by
state, and the decision leases lost (counted in Redis by the losing pass)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from fleet import locks
from fleet.choices import ActionKind, ActionState, DeliveryState
from fleet.models import Action, WebhookDelivery, WebhookEndpoint
from tests.test_metrics import one, scrape


@pytest.fixture(autouse=True)
def empty_redis():
    test_redis = redis.Redis.from_url(settings.REDIS_URL)  # a test may point the settings elsewhere
    test_redis.flushdb()
    yield
    test_redis.flushdb()


def test_the_oldest_proposal_of_each_kind_is_aged_and_decided_ones_are_not(db):
    now = timezone.now()

    def action(kind, state, minutes_ago):
        Action.objects.create(
            kind=kind, state=state, title=kind, created_at=now - timedelta(minutes=minutes_ago)
        )

    action(ActionKind.DEFRAG, ActionState.PROPOSED, 40)
    action(ActionKind.DEFRAG, ActionState.PROPOSED, 5)
    action(ActionKind.EVACUATION, ActionState.PROPOSED, 2)
    action(ActionKind.RECOVERY, ActionState.APPROVED, 90)  # decided: not waiting
    action(ActionKind.RECLAIM, ActionState.EXPIRED, 90)

    samples = scrape()

    ages = samples["rackwise_action_oldest_proposed_seconds"]
    assert sorted(dict(k)["kind"] for k in ages) == ["defrag", "evacuation"]
    assert 40 * 60 <= one(samples, "rackwise_action_oldest_proposed_seconds", kind="defrag") < 41 * 60
    assert 2 * 60 <= one(samples, "rackwise_action_oldest_proposed_seconds", kind="evacuation") < 3 * 60


def test_webhook_deliveries_are_counted_by_state_every_state_present(db):
    endpoint = WebhookEndpoint.objects.create(url="https://hooks.example.com/x", event_types=["job.placed"])
    for state, n in ((DeliveryState.DEAD, 2), (DeliveryState.SUCCEEDED, 3), (DeliveryState.RETRYING, 1)):
        for _ in range(n):
            WebhookDelivery.objects.create(endpoint=endpoint, event_type="job.placed", state=state)

    samples = scrape()

    assert one(samples, "rackwise_webhook_deliveries", state="dead") == 2
    assert one(samples, "rackwise_webhook_deliveries", state="succeeded") == 3
    assert one(samples, "rackwise_webhook_deliveries", state="retrying") == 1
    assert one(samples, "rackwise_webhook_deliveries", state="pending") == 0


def test_a_lost_lease_is_counted_once_and_a_kept_one_not_at_all(db):
    assert one(scrape(), "rackwise_decision_leases_lost_total") == 0
    with locks.decisions(wait=None) as lease:
        lease.checkpoint()  # still ours: nothing counted
        assert locks.leases_lost() == 0
        redis.Redis.from_url(settings.REDIS_URL).set(locks.DECISION_LOCK, b"someone-else", px=5000)
        for _ in range(2):  # the second refusal is the same loss
            with pytest.raises(locks.LockLost):
                lease.checkpoint()

    assert one(scrape(), "rackwise_decision_leases_lost_total") == 1


def test_redis_not_answering_leaves_the_lost_leases_out_but_the_rest_is_served(db, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"

    samples = scrape()

    assert "rackwise_decision_leases_lost_total" not in samples
    assert one(samples, "rackwise_webhook_deliveries", state="dead") == 0
