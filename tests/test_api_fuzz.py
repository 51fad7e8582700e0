"""Schemathesis against /api/schema/, as an operator and as a submitter.

Every operation of the schema gets generated requests (valid ones, and ones the
schema says are invalid), once with generated ids and once with the id of a real
object, through the real WSGI app on the test database. Each answer must be no
5xx, and its status code, content type, headers and body must be the ones the
schema documents. The number of examples is bounded (``EXAMPLES`` per operation
and mode) and the run is derandomised, so it is the same run every time.

Left out, with the reason:
- ``POST /api/nodes/{id}/heartbeat/``: only a node's agent token gets past the
  permission check (tests/test_heartbeats.py fuzzes its payload fields).
- ``POST /api/actions/{id}/callback/``: only a body HMAC-signed with the executor's
  secret gets past the signature check (tests/test_actions_api.py covers it).
"""

from __future__ import annotations

from collections import Counter

import pytest
import schemathesis
from django.core.cache import caches
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from fleet.models import Action, AuditEvent, Job, Node, Rack
from fleet.services.defrag import plan_defrag
from fleet.services.users import ensure_user

EXAMPLES = 20
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
LEFT_OUT = r"^/api/(nodes/\{id\}/heartbeat|actions/\{id\}/callback)/$"


@pytest.fixture
def wsgi_app(db):
    """The real WSGI app. Django closes "old" connections around every request it
    serves, which would end the test's transaction; the test client turns that
    off the same way."""
    from rackwise.wsgi import application

    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield application
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def _headers(user) -> dict[str, str]:
    token = ensure_user(None, user.username, role=_role(user), tenants=list(user.tenants.values_list("name", flat=True)))[1]
    # Uncompressed: the WSGI transport hands back the body as sent, and does not
    # undo the gzip the console snapshot gets when a client accepts it.
    return {"Authorization": f"Token {getattr(token, 'key', token)}", "Accept-Encoding": "identity"}


def _role(user) -> str:
    from fleet.permissions import role_of

    return role_of(user).value


def _real_ids() -> dict[str, int]:
    """An existing object per collection, so detail operations get past the 404."""
    from fleet.models import WebhookEndpoint

    webhook = WebhookEndpoint.objects.order_by("id").first()
    ids = {
        "jobs": Job.objects.order_by("id").values_list("id", flat=True).first(),
        "racks": Rack.objects.order_by("id").values_list("id", flat=True).first(),
        "nodes": Node.objects.order_by("id").values_list("id", flat=True).first(),
        "audit": AuditEvent.objects.order_by("id").values_list("id", flat=True).first(),
        "actions": Action.objects.order_by("id").values_list("id", flat=True).first(),
        "webhooks": webhook.pk if webhook else None,
    }
    return {k: v for k, v in ids.items() if v is not None}


def _fuzz(app, user) -> Counter[tuple[str, int]]:
    """Run every operation; returns how often each (operation, status) was answered."""
    headers = _headers(user)
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", app, headers=headers)
    schema = schema.exclude(path_regex=LEFT_OUT)
    real = _real_ids()
    answered: Counter[tuple[str, int]] = Counter()
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) > 30, "the schema lost its operations"
    for operation in operations:
        collection = operation.path.split("/")[2]
        fixed = [None]
        if "{id}" in operation.path and collection in real:
            fixed.append({"id": real[collection]})
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            # Negative cases break the request somewhere; a real id leaves little to break.
            for path_parameters in fixed if mode == GenerationMode.POSITIVE else [None]:
                strategy = operation.as_strategy(generation_mode=mode, path_parameters=path_parameters)

                @settings(
                    max_examples=EXAMPLES,
                    deadline=None,
                    derandomize=True,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                )
                @given(case=strategy)
                def run(case) -> None:
                    # Throttling is not what is tested here; start every request afresh.
                    for cache in caches.all():
                        cache.clear()
                    response = case.call_and_validate(headers=headers, checks=CHECKS)
                    answered[(case.operation.label, response.status_code)] += 1

                try:
                    run()
                except Unsatisfiable:
                    # Nothing in this operation can be made invalid (no parameters, no body).
                    if mode == GenerationMode.POSITIVE:
                        raise
    return answered


@pytest.fixture
def populated(fragmented, operator):
    """The fragmented fleet, a proposed defrag plan, and a webhook endpoint."""
    from fleet.choices import WebhookEvent
    from fleet.services.webhooks import create_endpoint

    plan_defrag(None)
    # A public address literal: no DNS lookup, and not one a webhook SSRF guard refuses.
    create_endpoint(operator, url="https://93.184.215.14/rackwise", event_types=[WebhookEvent.values[0]])
    return fragmented


def _succeeded(answered: Counter[tuple[str, int]]) -> set[str]:
    return {label for label, status in answered if 200 <= status < 300}


def test_the_api_answers_an_operator_as_its_schema_says(populated, wsgi_app, operator):
    answered = _fuzz(wsgi_app, operator)
    # The requests got past authentication: most operations succeeded at least once.
    assert len(_succeeded(answered)) >= 25, sorted(answered.items())


def test_the_api_answers_a_submitter_as_its_schema_says(populated, wsgi_app, submitter):
    answered = _fuzz(wsgi_app, submitter)
    assert {"GET /api/jobs/", "GET /api/actions/", "POST /api/jobs/{id}/cancel/"} <= _succeeded(answered)
    # Operator-only operations refused it, as documented.
    assert answered[("POST /api/actions/defrag/", 403)] > 0
