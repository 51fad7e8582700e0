"""Schemathesis against /api/schema/, as an operator and as a submitter.

Every operation of the schema gets generated requests (valid ones, and ones the
schema says are invalid), once with generated ids and once with the id of a real
object, and the schema's own examples (bodies the API accepts: a job submission
reaches placement, a webhook endpoint is created), through the real WSGI app on
the test database. Then the stateful mode: schemathesis links operations by the
ids their answers carry (POST /api/jobs/ -> GET /api/jobs/{id}/ -> cancel ...) and
runs chains of them. Each answer must be no 5xx, and its status code, content
type, headers and body must be the ones the schema documents. The suite runs a
bounded, derandomised subset (``RACKWISE_FUZZ_EXAMPLES`` per operation and mode,
20; ``RACKWISE_FUZZ_STATEFUL_EXAMPLES`` chains, 25); ``benchmarks/api_fuzz.py``
runs 200 of each and prints the counts.

Left out, with the reason:
- ``POST /api/nodes/{id}/heartbeat/``: only a node's agent token gets past the
  permission check (tests/test_heartbeats.py fuzzes its payload fields).
- ``POST /api/actions/{id}/callback/``: only a body HMAC-signed with the executor's
  secret gets past the signature check (tests/test_actions_api.py covers it).
"""

from __future__ import annotations

import os
from collections import Counter
from itertools import cycle

import pytest
import schemathesis
from django.core.cache import caches
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, transaction
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
from fleet.services.decisions.defrag import plan_defrag
from fleet.services.users import ensure_user

EXAMPLES = int(os.environ.get("RACKWISE_FUZZ_EXAMPLES", "20"))
STATEFUL_EXAMPLES = int(os.environ.get("RACKWISE_FUZZ_STATEFUL_EXAMPLES", "25"))
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
    token = ensure_user(
        None, user.username, role=_role(user), tenants=list(user.tenants.values_list("name", flat=True))
    )[1]
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


def _schema(app, headers):
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", app, headers=headers)
    return schema.exclude(path_regex=LEFT_OUT)


def _settings(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
        stateful_step_count=8,
    )


def _fresh_limits() -> None:
    # Throttling is not what is tested here; start every request afresh.
    for cache in caches.all():
        cache.clear()


def _fuzz(app, user) -> Counter[tuple[str, int]]:
    """Run every operation; returns how often each (operation, status) was answered."""
    headers = _headers(user)
    schema = _schema(app, headers)
    real = _real_ids()
    answered: Counter[tuple[str, int]] = Counter()

    def drive(strategy, max_examples: int) -> None:
        @_settings(max_examples)
        @given(case=strategy)
        def run(case) -> None:
            _fresh_limits()
            response = case.call_and_validate(headers=headers, checks=CHECKS)
            answered[(case.operation.label, response.status_code)] += 1

        run()

    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) > 30, "the schema lost its operations"
    for operation in operations:
        for strategy in schema.get_strategies_from_examples(operation):
            drive(strategy, 5)
        collection = operation.path.split("/")[2]
        fixed = [None]
        if "{id}" in operation.path and collection in real:
            fixed.append({"id": real[collection]})
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            # Negative cases break the request somewhere; a real id leaves little to break.
            for path_parameters in fixed if mode == GenerationMode.POSITIVE else [None]:
                try:
                    drive(
                        operation.as_strategy(generation_mode=mode, path_parameters=path_parameters), EXAMPLES
                    )
                except Unsatisfiable:
                    # Nothing in this operation can be made invalid (no parameters, no body).
                    if mode == GenerationMode.POSITIVE:
                        raise
    return answered


def _stateful(app, user) -> Counter[tuple[str, int]]:
    """Chains of calls linked by the ids in their answers (schemathesis infers
    the links from the schema); returns the (operation, status) counts."""
    headers = _headers(user)
    answered: Counter[tuple[str, int]] = Counter()

    seeds = {label: iter(cycle(bodies)) for label, bodies in _accepted_bodies().items()}
    calls: Counter[str] = Counter()

    class Chains(_schema(app, headers).as_state_machine()):
        # Every chain starts from the same fleet (a savepoint rolled back after
        # it): hypothesis replays choices, and a chain that met what the last
        # one left behind would draw differently ("inconsistent data generation").
        def setup(self) -> None:
            calls.clear()
            self.savepoint = transaction.savepoint()

        def teardown(self) -> None:
            transaction.savepoint_rollback(self.savepoint)

        def before_call(self, case) -> None:
            _fresh_limits()
            # Every other job or webhook body is one the API accepts (the schema's
            # examples), so chains start from real objects; the rest stay generated.
            label = case.operation.label
            calls[label] += 1
            if label in seeds and calls[label] % 2:
                case.body = dict(next(seeds[label]))

        def get_call_kwargs(self, case) -> dict:
            return {"headers": headers}

        def validate_response(self, response, case, additional_checks=None, **kwargs) -> None:
            answered[(case.operation.label, response.status_code)] += 1
            case.validate_response(response, checks=CHECKS, transport_kwargs=kwargs or None)

    Chains.run(settings=_settings(STATEFUL_EXAMPLES))
    return answered


def _accepted_bodies() -> dict[str, list[dict]]:
    """The request examples of the schema (bodies the API accepts), by operation."""
    from fleet.api.views import JOB_EXAMPLES
    from fleet.api.webhooks import WEBHOOK_EXAMPLES

    return {
        "POST /api/jobs/": [e.value for e in JOB_EXAMPLES],
        "POST /api/webhooks/": [e.value for e in WEBHOOK_EXAMPLES],
    }


def _report(who: str, answered: Counter[tuple[str, int]]) -> None:
    """The counts, for benchmarks/api_fuzz.py (pytest -s shows them)."""
    by_class = Counter(f"{status // 100}xx" for (_, status), n in answered.items() for _ in range(n))
    print(
        f"\n{who}: {sum(answered.values())} requests, {dict(sorted(by_class.items()))}, "
        f"{len(_succeeded(answered))} operations answered 2xx"
    )
    for (label, status), n in sorted(answered.items()):
        print(f"  {status} {n:5d}  {label}")


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
    _report("operator", answered)
    # The requests got past authentication: most operations succeeded at least once,
    # and the schema's examples were accepted: a job reached the scheduler, a webhook was made.
    assert len(_succeeded(answered)) >= 25, sorted(answered.items())
    assert answered[("POST /api/jobs/", 201)] > 0 and answered[("POST /api/webhooks/", 201)] > 0
    assert answered[("POST /api/jobs/what-if/", 200)] > 0


def test_the_api_answers_a_submitter_as_its_schema_says(populated, wsgi_app, submitter):
    answered = _fuzz(wsgi_app, submitter)
    _report("submitter", answered)
    assert {"GET /api/jobs/", "GET /api/actions/", "POST /api/jobs/{id}/cancel/"} <= _succeeded(answered)
    assert answered[("POST /api/jobs/", 201)] > 0
    # Operator-only operations refused it, as documented.
    assert answered[("POST /api/actions/defrag/", 403)] > 0


@pytest.mark.parametrize("persona", ["operator", "submitter"])
def test_chains_of_calls_linked_by_their_ids_answer_as_the_schema_says(populated, wsgi_app, persona, request):
    answered = _stateful(wsgi_app, request.getfixturevalue(persona))
    _report(f"{persona}, stateful", answered)
    assert not [key for key in answered if key[1] >= 500]
    # The chains went past their first call: an object made, then used by its id.
    linked = {label for label in _succeeded(answered) if "{id}" in label}
    assert linked, sorted(answered.items())
