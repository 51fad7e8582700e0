"""Read models (fleet.services.read.read_models): the summary and fragmentation figures
are computed once per committed change and shared through the cache; a busy
fleet recomputes at most once per RACKWISE_READ_MODEL_MAX_AGE_S; with the cache
down every read computes. The API, the Fleet page and /metrics read the same."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet import read_cache
from fleet.services.jobs.submit import JobSpec, submit_job
from fleet.services.read import read_models


@pytest.fixture
def shared(settings, fleet):
    settings.RACKWISE_READ_MODELS = True
    settings.RACKWISE_READ_MODEL_MAX_AGE_S = 0
    cache.delete_many([read_cache.KEY, read_models.PREFIX + "summary", read_models.PREFIX + "fragmentation"])
    yield
    cache.delete_many([read_cache.KEY, read_models.PREFIX + "summary", read_models.PREFIX + "fragmentation"])


def _submit(submitter, capture, name="waits"):
    with capture(execute=True):
        return submit_job(submitter, JobSpec(name=name, num_nodes=18, gpus_per_node=4, tenant="llm"))


def test_a_new_rack_is_seen_by_the_next_read(shared, django_capture_on_commit_callbacks):
    from fleet.services.nodes.inventory import create_rack

    assert read_models.summary()["racks"] == 2

    with django_capture_on_commit_callbacks(execute=True):
        create_rack(None, name="r3")

    assert read_models.summary()["racks"] == 3


def test_a_second_read_asks_the_database_nothing(shared):
    first = read_models.summary()
    with CaptureQueriesContext(connection) as queries:
        again = read_models.summary()
        read_models.summary()
    assert again == first and len(queries) == 0


def test_a_committed_change_is_seen_by_the_next_read(shared, submitter, django_capture_on_commit_callbacks):
    assert read_models.summary()["jobs_by_state"]["pending"] == 0
    before = read_models.fragmentation()

    _submit(submitter, django_capture_on_commit_callbacks)

    assert read_models.summary()["jobs_by_state"]["pending"] == 1
    assert read_models.fragmentation() is not before


def test_while_changes_keep_coming_it_recomputes_at_most_once_per_interval(
    shared, settings, submitter, django_capture_on_commit_callbacks, monkeypatch
):
    settings.RACKWISE_READ_MODEL_MAX_AGE_S = 1.0
    clock = [1000.0]
    monkeypatch.setattr(read_models.time, "time", lambda: clock[0])
    assert read_models.summary()["jobs_by_state"]["pending"] == 0

    _submit(submitter, django_capture_on_commit_callbacks)
    clock[0] += 0.5
    assert read_models.summary()["jobs_by_state"]["pending"] == 0, "younger than the interval: served"
    clock[0] += 0.6
    assert read_models.summary()["jobs_by_state"]["pending"] == 1, "older, and the fleet changed: recomputed"


def test_with_the_cache_down_every_read_computes(shared, submitter, monkeypatch):
    monkeypatch.setattr(read_cache, "generation", lambda: None)
    assert read_models.summary()["jobs_by_state"]["pending"] == 0
    submit_job(submitter, JobSpec(name="uncommitted-but-visible", num_gpus=4, tenant="llm"))
    assert read_models.summary()["jobs_by_state"]["pending"] == 1


def test_a_failing_cache_never_fails_a_writer(
    shared, submitter, django_capture_on_commit_callbacks, monkeypatch
):
    def broken(*args, **kwargs):
        raise ConnectionError("redis is down")

    monkeypatch.setattr(read_cache.cache, "add", broken)
    job = _submit(submitter, django_capture_on_commit_callbacks, name="still-submitted")
    assert job.pk


def test_the_api_and_metrics_read_the_same_figures(
    shared, viewer_client, submitter, django_capture_on_commit_callbacks
):
    _submit(submitter, django_capture_on_commit_callbacks)
    summary = viewer_client.get("/api/fleet/summary/").json()
    metrics = viewer_client.get("/metrics").content.decode()
    assert summary["jobs_by_state"]["pending"] == 1
    assert 'rackwise_jobs{state="pending"} 1.0' in metrics
    assert f"rackwise_gpus_total {float(summary['gpus_total'])}" in metrics


def test_a_change_asks_a_worker_to_refresh_and_readers_then_find_it_computed(
    shared, settings, submitter, django_capture_on_commit_callbacks, monkeypatch
):
    """Off the request path: the bump on commit queues one refresh per interval,
    and after it a reader computes nothing."""
    from fleet import dispatch

    settings.RACKWISE_READ_MODEL_MAX_AGE_S = 10.0
    queued: list[float] = []
    monkeypatch.setattr(dispatch, "refresh_read_models_in", queued.append)
    read_cache.refresh_started()
    read_models.summary()  # stored at the old generation
    _submit(submitter, django_capture_on_commit_callbacks)
    _submit(submitter, django_capture_on_commit_callbacks, name="second")
    assert queued == [settings.RACKWISE_READ_MODEL_REFRESH_S], "one refresh for the burst"
    assert read_models.summary()["jobs_by_state"]["pending"] == 0, "younger than the max age: served"

    assert read_models.refresh() == read_cache.generation()

    def computed():
        raise AssertionError("a reader computed the read model")

    monkeypatch.setattr(read_models, "MODELS", {"summary": computed, "fragmentation": computed})
    assert read_models.summary()["jobs_by_state"]["pending"] == 2
    _submit(submitter, django_capture_on_commit_callbacks, name="third")
    assert len(queued) == 2, "a change after the refresh started asks for the next one"


def test_with_nobody_reading_a_change_asks_for_no_refresh(
    shared, submitter, django_capture_on_commit_callbacks, monkeypatch
):
    from django.core.cache import cache

    from fleet import dispatch

    queued: list[float] = []
    monkeypatch.setattr(dispatch, "refresh_read_models_in", queued.append)
    read_cache.refresh_started()
    cache.delete(read_cache.READ_RECENTLY)
    _submit(submitter, django_capture_on_commit_callbacks)
    assert queued == []
    read_models.fragmentation()  # a console or a scrape reads them
    _submit(submitter, django_capture_on_commit_callbacks, name="second")
    assert len(queued) == 1
