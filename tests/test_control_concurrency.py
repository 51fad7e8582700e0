"""Two worker processes and many concurrent API submissions over real HTTP: the
engine's invariant checker finds nothing wrong at any point, and every job runs
to completion."""

from __future__ import annotations

import json
import random
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from fleet.choices import OPEN_ACTION_STATES, JobState
from fleet.models import Action, Job
from fleet.services.users import ensure_user
from tests.support import consistent_violations, wait_for, workers

pytestmark = pytest.mark.django_db(transaction=True)

SHAPES = [
    {"num_gpus": 1},
    {"num_gpus": 2},
    {"num_gpus": 4},
    {"num_nodes": 2, "gpus_per_node": 4},
    {"num_nodes": 4, "gpus_per_node": 4},
    {"num_nodes": 8, "gpus_per_node": 4},
    {"num_nodes": 16, "gpus_per_node": 4},
    {"num_nodes": 12, "gpus_per_node": 4, "locality": "preferred"},
]
JOBS = 48


def _post(url: str, token: str, body: dict) -> int:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status


def test_concurrent_submissions_with_two_workers_keep_every_invariant(live_server, fleet, submitter):
    token = ensure_user(None, submitter.username, role="submitter")[1]
    rng = random.Random(7)
    bodies = [
        {
            "name": f"job-{i}",
            "tenant": "llm",
            "expected_duration_s": rng.randint(100, 400),
            **rng.choice(SHAPES),
        }
        for i in range(JOBS)
    ]
    samples: list[list[str]] = []
    with workers(2):
        with ThreadPoolExecutor(max_workers=8) as pool:
            codes = list(pool.map(lambda b: _post(f"{live_server.url}/api/jobs/", token, b), bodies))
        assert codes == [201] * JOBS

        def settled() -> bool:
            samples.append(consistent_violations())
            return (
                Job.objects.filter(state=JobState.COMPLETED).count() == JOBS
                and not Action.objects.filter(state__in=OPEN_ACTION_STATES).exists()
            )

        wait_for(settled, 120, "every job to complete")

    assert len(samples) > 5, "the state was checked while jobs ran"
    assert [s for s in samples if s] == []
    assert Job.objects.exclude(state=JobState.COMPLETED).count() == 0
    # Each job was placed exactly once.
    for job in Job.objects.all():
        assert job.actions.filter(kind__in=["placement", "placement_spill"]).count() == 1, job
