"""The decision lock is short and renewed: a process killed while holding it
blocks the others for at most one TTL; a pass that outlives the TTL keeps it;
a pass that lost it stops before committing anything more. Real Redis, a real
subprocess, real PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import redis
from django.conf import settings

from fleet import locks
from fleet.choices import JobState
from fleet.models import Action, Allocation, Job
from fleet.services.decisions import scheduling
from fleet.services.jobs.submit import JobSpec, submit_job
from fleet.tasks import schedule_pending
from tests.support import ROOT, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

TTL = 2.0

HOLDER = textwrap.dedent(
    """
    import time
    import django

    django.setup()
    from fleet import locks

    with locks.decisions(wait=None):
        print("held", flush=True)
        time.sleep(600)
    """
)


def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


def _steal() -> None:
    """The lock lapses and another pass takes it: the key now holds their token."""
    _redis().set(locks.DECISION_LOCK, b"someone-else", px=int(TTL * 1000))


@pytest.fixture
def short_ttl(settings):
    settings.RACKWISE_DECISION_LOCK_TTL_S = TTL
    _redis().delete(locks.DECISION_LOCK, locks.SCHEDULE_DIRTY)
    yield TTL
    _redis().delete(locks.DECISION_LOCK, locks.SCHEDULE_DIRTY)


def test_a_lock_held_by_a_killed_process_is_free_again_within_the_short_ttl(short_ttl):
    env = os.environ | {
        "DJANGO_SETTINGS_MODULE": "rackwise.settings",
        "REDIS_URL": settings.REDIS_URL,
        "RACKWISE_DECISION_LOCK_TTL_S": str(TTL),
    }
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], cwd=ROOT, env=env, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"held"
        # Alive past two TTLs: its renewals keep the lock.
        time.sleep(TTL * 2)
        with pytest.raises(locks.Busy):
            with locks.decisions(wait=None):
                pass
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        # Nobody renews it now: it expires within one TTL (120 s before the fix).
        left_ms = _redis().pttl(locks.DECISION_LOCK)
        assert 0 < left_ms <= TTL * 1000
        wait_for(lambda: not locks.is_held(locks.DECISION_LOCK), TTL + 1, "the lock to lapse")
        with locks.decisions(wait=None) as lease:
            assert not lease.lost
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_pass_that_outlives_the_ttl_keeps_the_lock_and_no_second_pass_starts(short_ttl, fleet, submitter):
    submit_job(submitter, JobSpec(name="queued", num_gpus=4, tenant="llm"))
    with locks.decisions(wait=None) as lease:
        time.sleep(TTL * 2)  # a long pass
        assert locks.is_held(locks.DECISION_LOCK) and not lease.lost
        assert schedule_pending() == "another worker holds the decision lock; it will see the queue is dirty"
        assert Job.objects.get().state == JobState.PENDING, "no second pass ran meanwhile"
        lease.checkpoint()  # still ours
    assert not locks.is_held(locks.DECISION_LOCK), "released when the pass ends"


def test_a_pass_whose_lock_was_lost_stops_before_committing_its_decisions(short_ttl, fleet, submitter):
    job = submit_job(submitter, JobSpec(name="queued", num_gpus=4, tenant="llm"))
    with locks.decisions(wait=None) as lease:
        _steal()
        with pytest.raises(locks.LockLost):
            scheduling.schedule_pass(checkpoint=lease.checkpoint)
    job.refresh_from_db()
    assert job.state == JobState.PENDING
    assert not Allocation.objects.exists() and not Action.objects.exists(), (
        "nothing of the pass was committed"
    )
    assert _redis().get(locks.DECISION_LOCK) == b"someone-else", (
        "the lost pass does not release the new holder's lock"
    )


def test_the_renewer_notices_a_lost_lock_and_the_next_checkpoint_refuses(short_ttl):
    with locks.decisions(wait=None) as lease:
        _steal()
        wait_for(lambda: lease.lost, TTL * 2, "the renewer to notice")
        with pytest.raises(locks.LockLost):
            lease.checkpoint()


def test_a_scheduling_task_that_loses_the_lock_leaves_the_queue_dirty_for_the_next_holder(
    short_ttl, fleet, submitter, monkeypatch
):
    job = submit_job(submitter, JobSpec(name="queued", num_gpus=4, tenant="llm"))
    real_pass = scheduling.schedule_pass

    def pass_that_loses_its_lock(checkpoint):
        _steal()
        return real_pass(checkpoint=checkpoint)

    # Not a mock of a service: the real pass runs; only the moment of loss is staged.
    monkeypatch.setattr(scheduling, "schedule_pass", pass_that_loses_its_lock)
    assert schedule_pending() == "0 pass(es); stopped: the decision lock was lost"
    assert _redis().get(locks.SCHEDULE_DIRTY), "the next holder will go round again"
    job.refresh_from_db()
    assert job.state == JobState.PENDING


def test_a_pass_that_finds_the_lock_held_waits_out_a_holder_that_no_longer_renews(
    short_ttl, fleet, submitter
):
    """The holder may be gone (its host cut off): it will never see the queue is
    dirty. A request that finds the lock held waits up to one lease for it, and
    passes once the gone holder's lease lapses, without waiting for beat."""
    job = submit_job(submitter, JobSpec(name="queued", num_gpus=4, tenant="llm"))
    _steal()  # a holder that no longer renews
    started = time.monotonic()
    assert schedule_pending() == "1 pass(es)"
    assert time.monotonic() - started <= TTL + 1
    job.refresh_from_db()
    assert job.state != JobState.PENDING
