"""Shared fixtures: a small fleet and one persona per role.

Personas:
- ``viewer``: reads everything.
- ``submitter``: submits and cancels jobs of tenant ``llm``.
- ``other_submitter``: a submitter of tenant ``vision`` (another tenant).
- ``operator``: everything.
- ``outsider``: logged in, but holds no Rackwise role; refused everywhere.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.test import APIClient

from fleet import engine
from fleet.choices import RackKind
from fleet.models import Node
from fleet.services.jobs.allocations import apply_placement, start_job
from fleet.services.jobs.submit import JobSpec, submit_job
from fleet.services.nodes.inventory import create_rack
from fleet.services.users import ensure_user
from tests.slurm.cluster import slurm_cluster, slurm_env  # noqa: F401  (one cluster per session, for every directory)
from tests.webhook_receiver import LOOPBACK_NET, Receiver


@pytest.fixture(autouse=True)
def read_models_computed(settings):
    """Tests here run in a transaction that never commits, so the read models'
    generation (bumped on commit) never moves: they read the figures computed.
    tests/test_read_models.py turns the read models on; the app servers and
    workers the browser tests start use them, with no extra age (FAST_CLUSTER)."""
    settings.RACKWISE_READ_MODELS = False


@pytest.fixture(autouse=True)
def live_fleet_verified(settings):
    """Every scheduling pass checks the scheduler's in-memory fleet against a fresh
    load of the rows (LiveFleetDrift on a difference); each test starts with none
    in memory."""
    settings.RACKWISE_LIVE_FLEET_VERIFY = True
    engine.forget_live_fleet()


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    # PBKDF2 is slow on purpose; tests create many users.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def fleet(db):
    """Two NVL72 racks (18 nodes x 4 GPUs each, 144 GPUs)."""
    return [
        create_rack(None, name=f"r{i}", kind=RackKind.NVL72, site="dc", row="A", position=i) for i in (1, 2)
    ]


@pytest.fixture
def receiver(settings) -> Iterator[Receiver]:
    """A real HTTP server on 127.0.0.1 that checks every webhook's signature.
    Loopback is allowed as a webhook target while it runs (it is refused by
    default: fleet.services.webhook_targets)."""
    settings.RACKWISE_WEBHOOK_ALLOW_NETS = [LOOPBACK_NET]
    r = Receiver()
    yield r
    r.stop()


def _client_for(user) -> APIClient:
    client = APIClient()
    if user is not None:
        client.force_authenticate(user)
    return client


@pytest.fixture
def viewer(db):
    return ensure_user(None, "vera", role="viewer")[0]


@pytest.fixture
def submitter(db):
    return ensure_user(None, "sam", role="submitter", tenants=["llm"])[0]


@pytest.fixture
def other_submitter(db):
    return ensure_user(None, "otto", role="submitter", tenants=["vision"])[0]


@pytest.fixture
def operator(db):
    return ensure_user(None, "olga", role="operator")[0]


@pytest.fixture
def outsider(db):
    return get_user_model().objects.create_user("nobody", password="x" * 12)


@pytest.fixture
def anon_client():
    return APIClient()


@pytest.fixture
def viewer_client(viewer):
    return _client_for(viewer)


@pytest.fixture
def submitter_client(submitter):
    return _client_for(submitter)


@pytest.fixture
def other_client(other_submitter):
    return _client_for(other_submitter)


@pytest.fixture
def operator_client(operator):
    return _client_for(operator)


@pytest.fixture
def outsider_client(outsider):
    return _client_for(outsider)


@pytest.fixture
def fragmented(fleet, submitter, operator):
    """Rack r1 holds a preemptible 4-node job A, rack r2 a non-preemptible 4-node
    job B; a required 16-node job C waits, since no rack has 16 nodes plus its two
    spares free. Moving A next to B frees r1 whole."""
    r1, r2 = fleet

    def run(rack, name, preemptible):
        job = submit_job(
            submitter,
            JobSpec(
                name=name,
                num_nodes=4,
                gpus_per_node=4,
                tenant="llm",
                preemptible=preemptible,
                expected_duration_s=10**6,
            ),
        )
        nodes = Node.objects.filter(rack=rack).order_by("slot")[:4]
        apply_placement(None, job.pk, {n.pk: [0, 1, 2, 3] for n in nodes}, reason="test setup")
        return start_job(None, job.pk)

    a, b = run(r1, "a", True), run(r2, "b", False)
    c = submit_job(
        submitter, JobSpec(name="c", num_nodes=16, gpus_per_node=4, tenant="llm", expected_duration_s=10**6)
    )
    return a, b, c


@pytest.fixture
def clock(monkeypatch):
    """The server's clock (django.utils.timezone.now), moved by the test:
    ``clock.at = minutes`` from a fixed start."""

    class Clock:
        start = timezone.now().replace(microsecond=0)
        at = 0.0

        def now(self):
            return self.start + timedelta(minutes=self.at)

    c = Clock()
    monkeypatch.setattr(timezone, "now", c.now)
    return c


@pytest.fixture
def default_health_rules(db):
    """The health rules migrations 0015 and 0018 add (a transactional test
    elsewhere may have flushed them)."""
    from django.apps import apps

    for migration in ("0015_default_health_rules", "0018_climbing_rate_rules"):
        importlib.import_module(f"fleet.migrations.{migration}").add(apps, None)
