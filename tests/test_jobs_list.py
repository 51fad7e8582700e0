"""The Jobs page sorts and pages, and says how many rows it shows of how many
(#28 item 10: no sorting, and it stopped at 200 rows without saying so)."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from fleet.models import Job, Tenant


@pytest.fixture
def many_jobs(fleet, submitter):
    tenant = Tenant.objects.get(name="llm")
    Job.objects.bulk_create(
        Job(
            name=f"job-{i:03d}",
            owner=submitter,
            tenant=tenant,
            num_gpus=1 + i % 4,
            priority=i % 7,
            state="pending",
        )
        for i in range(205)
    )
    return list(Job.objects.order_by("id"))


def _rows(client: Client, **params) -> tuple[list[int], str]:
    response = client.get("/jobs/", params)
    assert response.status_code == 200, response.status_code
    text = response.content.decode()
    return [int(i) for i in re.findall(r'data-testid="job-row" data-job-id="(\d+)"', text)], text


def test_the_list_says_what_it_shows_and_pages_past_200(many_jobs, viewer):
    client = Client()
    client.force_login(viewer)
    first, text = _rows(client)
    assert len(first) == 200 and first[0] == many_jobs[-1].pk
    assert "Showing 1\N{EN DASH}200 of 205 jobs, newest first." in text
    assert 'data-testid="jobs-next"' in text and 'data-testid="jobs-previous"' not in text

    second, text = _rows(client, page=2)
    assert second == [j.pk for j in reversed(many_jobs[:5])]
    assert "Showing 201\N{EN DASH}205 of 205 jobs" in text and 'data-testid="jobs-previous"' in text


def test_the_list_sorts_by_what_the_operator_picks(many_jobs, viewer):
    client = Client()
    client.force_login(viewer)
    by_priority, text = _rows(client, sort="priority")
    expected = [j.pk for j in sorted(many_jobs, key=lambda j: (-j.priority, j.pk))][:200]
    assert by_priority == expected and "highest priority" in text
    oldest, _ = _rows(client, sort="oldest", page=2)
    assert oldest == [j.pk for j in many_jobs[200:]]


def test_an_unknown_sort_is_refused_with_the_choices(many_jobs, viewer):
    client = Client()
    client.force_login(viewer)
    response = client.get("/jobs/", {"sort": "random"})
    assert response.status_code == 400
    assert "random" in response.content.decode()
