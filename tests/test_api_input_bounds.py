"""Every number and string a user sends is bounded: what the fleet cannot mean, or a
value beyond a column's range, a NUL, a superscript digit, a 100,000-deep JSON
body, is a 400 that says what fits, never a 500 or a runaway allocation."""

from __future__ import annotations

import pytest
from django.test import Client

from fleet.choices import ActionState
from fleet.models import Action, AuditEvent, Job, Node, Quota
from fleet.services.decisions.defrag import plan_defrag

LISTS = [
    "/api/jobs/",
    "/api/racks/",
    "/api/nodes/",
    "/api/audit/",
    "/api/actions/",
    "/api/webhooks/",
    "/api/webhook-deliveries/",
]
BIGGER_THAN_BIGINT = "99999999999999999999"


# -- defrag requests (item 4) -----------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"free_racks": 3}, "free_racks", "the fleet has 2 rack(s); ask for at most 2"),
        ({"free_racks": 2**31}, "free_racks", "less than or equal to"),
        ({"room_for_nodes": 37}, "room_for_nodes", "the fleet has 36 node(s) of 4 GPUs"),
        ({"room_for_nodes": 10_000_000_000_000}, "room_for_nodes", "less than or equal to"),
        ({"room_for_nodes": 1_000_000}, "room_for_nodes", "ask for at most 36"),
        ({"room_for_nodes": 4, "gpus_per_node": 8}, "gpus_per_node", "node sizes: 4"),
        ({"gpus_per_node": 4}, "gpus_per_node", "goes with room_for_nodes"),
        ({"max_moves": 10**6}, "max_moves", "at most 1000 moves"),
        ({"budget_gpu_hours": "nan"}, "budget_gpu_hours", "valid number"),
        ({"budget_gpu_hours": "inf"}, "budget_gpu_hours", "valid number"),
        ({"budget_gpu_hours": 1e300}, "budget_gpu_hours", "less than or equal to"),
    ],
)
def test_it_refuses_a_defrag_target_beyond_what_the_fleet_has(fleet, operator_client, body, field, words):
    response = operator_client.post("/api/actions/defrag/", body, format="json")
    assert response.status_code == 400, response.content
    assert words in " ".join(response.json()[field])
    assert not Action.objects.exists()


def test_it_refuses_a_bad_defrag_request_without_expiring_the_open_plan(
    fragmented, operator, operator_client
):
    open_plan = plan_defrag(None).action
    assert open_plan is not None and open_plan.state == ActionState.PROPOSED
    response = operator_client.post("/api/actions/defrag/", {"room_for_nodes": 10**9}, format="json")
    assert response.status_code == 400
    open_plan.refresh_from_db()
    assert open_plan.state == ActionState.PROPOSED


def test_it_still_plans_a_target_the_fleet_can_hold(fleet, operator_client):
    for body in ({"free_racks": 2}, {"room_for_nodes": 36, "gpus_per_node": 4}, {"max_moves": 1000}):
        response = operator_client.post("/api/actions/defrag/", body, format="json")
        assert response.status_code == 200, (body, response.content)
        assert response.json()["proposed"] is False


# -- job submission and the console endpoints (item 4: every other number) --------------


@pytest.mark.parametrize("field", ["num_gpus", "num_nodes", "gpus_per_node", "segment_nodes"])
def test_it_refuses_a_job_size_beyond_the_columns_range(fleet, submitter_client, field):
    body = {"name": "huge", "num_gpus": 8, field: 10**400}
    if field == "num_gpus":
        body = {"name": "huge", "num_gpus": 10**400}
    response = submitter_client.post("/api/jobs/", body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("priority", 10**30),
        ("checkpoint_interval_s", 2**31),
        ("expected_duration_s", 10**30),
        ("priority", "1e999"),
    ],
)
def test_it_refuses_a_job_number_beyond_its_bound(fleet, submitter_client, field, value):
    response = submitter_client.post("/api/jobs/", {"name": "j", "num_gpus": 4, field: value}, format="json")
    assert response.status_code == 400 and field in response.json(), response.content


def test_it_refuses_a_job_as_large_as_a_float_cannot_hold(fleet, submitter_client):
    # 10^400 GPUs made `num_gpus / gpus_per_node` raise OverflowError (a 500).
    response = submitter_client.post("/api/jobs/", {"name": "j", "num_gpus": 10**400}, format="json")
    assert response.status_code == 400


@pytest.mark.parametrize("hours", ["nan", "inf", "-inf", "0", "721", "1e999", "x", "9" * 400])
def test_it_refuses_sample_hours_outside_one_to_720(fleet, viewer_client, hours):
    response = viewer_client.get("/api/console/samples/", {"hours": hours})
    assert response.status_code == 400 and "1 to 720" in response.json()["hours"][0]


def test_it_serves_samples_for_hours_within_bounds(fleet, viewer_client):
    for hours in ("1", "6.5", "720"):
        assert viewer_client.get("/api/console/samples/", {"hours": hours}).status_code == 200


@pytest.mark.parametrize("ids", [BIGGER_THAN_BIGINT, "1,x", "²", "-1", "1\x00", ",".join(["1"] * 1001)])
def test_it_refuses_console_rack_ids_that_are_not_rack_ids(fleet, viewer_client, ids):
    response = viewer_client.get("/api/console/racks/", {"ids": ids})
    assert response.status_code == 400 and "ids" in response.json()


def test_it_serves_console_racks_by_id(fleet, viewer_client):
    ids = f"{fleet[0].pk},{fleet[1].pk},{fleet[1].pk + 1000}"
    assert [r["name"] for r in viewer_client.get("/api/console/racks/", {"ids": ids}).json()["racks"]] == [
        "r1",
        "r2",
    ]


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/api/audit/", {"object_id": "\x00"}),
        ("/api/audit/", {"actor": "a\x00"}),
        ("/api/audit/", {"action": "\x00"}),
        ("/api/audit/", {"since": "not a date"}),
        ("/api/audit/", {"since": "0092-10-31T05:17:19+21:06"}),  # PostgreSQL refused the offset
        ("/api/jobs/", {"tenant": "\x00"}),
        ("/api/jobs/", {"owner": "\x00"}),
        ("/api/nodes/", {"hostname": "\x00"}),
        ("/api/nodes/", {"rack": "\x00"}),
        ("/api/actions/", {"job": BIGGER_THAN_BIGINT}),
        ("/api/actions/", {"job": "1e400"}),
        ("/api/racks/", {"site": "\x00"}),
    ],
)
def test_it_refuses_list_filters_the_database_cannot_take(fleet, operator_client, path, params):
    response = operator_client.get(path, params)
    assert response.status_code in (200, 400), response.content
    if response.status_code == 200 and "job" in params:  # an id beyond the column matches nothing
        assert response.json()["results"] == []


# -- lists (item 8) ----------------------------------------------------------------------


@pytest.mark.parametrize("path", LISTS)
@pytest.mark.parametrize("limit", [BIGGER_THAN_BIGINT, "1001", "0", "-1", "abc", "²"])
def test_it_refuses_a_page_size_beyond_1000_on_every_list(fleet, operator_client, path, limit):
    response = operator_client.get(path, {"limit": limit})
    assert response.status_code == 400, response.content
    assert "from 1 to 1000" in response.json()["limit"][0]


@pytest.mark.parametrize("path", LISTS)
def test_it_refuses_an_offset_beyond_its_bound_on_every_list(fleet, operator_client, path):
    response = operator_client.get(path, {"offset": BIGGER_THAN_BIGINT})
    assert response.status_code == 400 and "offset" in response.json()


def test_it_serves_a_page_of_1000(fleet, operator_client):
    body = operator_client.get("/api/nodes/", {"limit": 1000}).json()
    assert body["count"] == 36 and len(body["results"]) == 36
    assert len(operator_client.get("/api/nodes/", {"limit": 5, "offset": 34}).json()["results"]) == 2


# -- JSON bodies (item 8) ------------------------------------------------------------


@pytest.mark.parametrize("path", ["/api/jobs/", "/api/actions/defrag/", "/api/approval-policy/"])
def test_it_refuses_a_json_body_100000_levels_deep(fleet, operator_client, path):
    body = "[" * 100_000 + "]" * 100_000
    method = operator_client.put if path == "/api/approval-policy/" else operator_client.post
    response = method(path, body, content_type="application/json")
    assert response.status_code == 400
    assert "at most 64" in response.json()["detail"]


def test_it_refuses_a_deep_json_object_hidden_in_a_field(fleet, submitter_client):
    body = '{"name": "j", "num_gpus": 4, "x": ' + '{"a": ' * 65 + "1" + "}" * 65 + "}"
    assert submitter_client.post("/api/jobs/", body, content_type="application/json").status_code == 400


def test_brackets_inside_strings_do_not_count_as_depth(fleet, submitter_client):
    body = '{"name": "' + "[" * 200 + '", "num_gpus": 4, "tenant": "llm"}'
    response = submitter_client.post("/api/jobs/", body, content_type="application/json")
    assert response.status_code == 201, response.content
    assert response.json()["name"] == "[" * 200  # the name column holds 200


# -- console pages (item 8) ------------------------------------------------------------------


@pytest.fixture
def page(db, viewer):
    client = Client()
    client.force_login(viewer)
    return client


@pytest.mark.parametrize(
    ("path", "params", "field"),
    [
        ("/jobs/", {"q": "²"}, None),
        ("/jobs/", {"q": "\x00"}, "q"),
        ("/jobs/", {"tenant": "\x00"}, "tenant"),
        ("/jobs/", {"state": "\x00"}, "state"),
        ("/actions/", {"kind": "\x00"}, "kind"),
        ("/actions/", {"kind": "nonsense"}, "kind"),
        ("/actions/", {"state": "\x00"}, "state"),
    ],
)
def test_it_answers_a_console_filter_it_cannot_take_with_400_and_says_which(fleet, page, path, params, field):
    response = page.get(path, params)
    if field is None:  # "²" is a name to search for, not an id
        assert response.status_code == 200
        return
    assert response.status_code == 400, response.status_code
    assert field in response.content.decode()


def test_a_job_id_in_the_search_box_finds_the_job(fleet, page, submitter):
    from fleet.services.jobs.submit import JobSpec, submit_job

    job = submit_job(submitter, JobSpec(name="findme", num_gpus=4, tenant="llm"))
    assert f'data-job-id="{job.pk}"' in page.get("/jobs/", {"q": str(job.pk)}).content.decode()
    assert page.get("/jobs/", {"q": BIGGER_THAN_BIGINT}).status_code == 200


@pytest.mark.parametrize("debug", [False, True])
@pytest.mark.parametrize("path", ["/api/actions/1.5/approve/", "/api/jobs/x.y/", "/api/no-such-thing/"])
def test_a_path_no_api_route_takes_answers_json(fleet, operator_client, path, settings, debug):
    """With DEBUG on (the quick start's default) too: #28 item 5 got Django's HTML debug page."""
    settings.DEBUG = debug
    response = operator_client.get(path)
    assert response.status_code == 404 and response["Content-Type"] == "application/json"
    assert response.json()["detail"].startswith("Not found")


def test_an_api_path_without_its_trailing_slash_is_told_the_one_that_exists(fleet, operator_client, settings):
    settings.DEBUG = True
    response = operator_client.post("/api/jobs", {"name": "x"}, format="json")
    assert response.status_code == 404
    assert "Did you mean '/api/jobs/'?" in response.json()["detail"]


@pytest.mark.parametrize("path", ["/api/no-such-thing", "/api/no-such-thing/", "/api/nodes/1/heartbeat"])
def test_a_path_no_route_takes_with_a_slash_either_is_sent_to_the_docs(fleet, operator_client, path):
    """Before, the last route (it takes every path) made every path look like one
    with a slash missing: '/api/no-such-thing/' was told to try '.../no-such-thing//'."""
    detail = operator_client.get(path).json()["detail"]
    if path.endswith("heartbeat"):  # only POST routes there, but a route all the same
        assert "Did you mean '/api/nodes/1/heartbeat/'?" in detail
    else:
        assert "Did you mean" not in detail and "listed at /api/docs/" in detail


def test_the_audit_log_takes_a_time_with_any_offset(fleet, operator_client):
    response = operator_client.get("/api/audit/", {"since": "2020-01-01T00:00:00+21:06"})
    assert response.status_code == 200 and response.json()["count"] > 0


# -- bodies JSON cannot carry into the database (item 16) -------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/jobs/", '{"name": "a\\ud800", "tenant": "llm", "num_gpus": 1}'),
        ("/api/jobs/what-if/", '{"name": "x", "tenant": "llm\\udfff", "num_gpus": 1}'),
        ("/api/webhooks/", '{"url": "https://example.com/\\ud83d", "events": ["job.*"]}'),
        ("/api/actions/defrag/", '{"note\\udc00": 1}'),
    ],
)
def test_a_lone_utf16_surrogate_is_a_400_that_names_it(fleet, operator_client, path, body):
    response = operator_client.post(path, body, content_type="application/json")
    assert response.status_code == 400, response.content
    assert "lone UTF-16 surrogate" in response.json()["detail"]
    assert not Job.objects.exists()


def test_a_surrogate_pair_is_a_character_and_is_kept(fleet, submitter_client):
    response = submitter_client.post(
        "/api/jobs/",
        '{"name": "train-\\ud83d\\ude80", "tenant": "llm", "num_gpus": 1}',
        content_type="application/json",
    )
    assert response.status_code == 201 and response.json()["name"] == "train-\N{ROCKET}"


@pytest.mark.parametrize("debug", [False, True])
def test_a_body_over_the_upload_limit_is_a_json_400_that_says_the_limit(
    fleet, submitter_client, settings, debug
):
    settings.DEBUG = debug
    body = '{"name": "%s", "tenant": "llm", "num_gpus": 1}' % (
        "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)
    )
    response = submitter_client.post("/api/jobs/", body, content_type="application/json")
    assert response.status_code == 400 and response["Content-Type"] == "application/json"
    assert "2,621,440 bytes" in response.json()["detail"]
    assert not Job.objects.exists()


# -- unknown fields: a misspelt field is a 400 naming it, on every operator write -------


def _node_id() -> int:
    return Node.objects.order_by("id").values_list("id", flat=True)[0]


UNKNOWN_FIELD_WRITES = [
    ("post", "/api/actions/defrag/", {"free_racks": 1, "freeracks": 2}, "freeracks"),
    ("put", "/api/approval-policy/", {"kind": "defrag", "mode": "manual", "modes": "auto"}, "modes"),
    (
        "put",
        "/api/tenants/llm/quotas/",
        {"quotas": [{"gpus_per_node": 4, "nominal_gpus": 8, "borrow_limit_gpus": 4}]},
        "quotas[0].borrow_limit_gpus",
    ),
    ("put", "/api/tenants/llm/quotas/", {"quotas": [], "reserved": ["r1"]}, "reserved"),
    ("patch", "/api/tenants/llm/", {"weigth": 2}, "weigth"),
    ("post", "/api/nodes/{node}/drain/", {"reason": "fans", "confrim": True}, "confrim"),
    (
        "post",
        "/api/webhooks/",
        {"url": "http://127.0.0.1:9/", "event_types": ["job.placed"], "events": ["job.failed"]},
        "events",
    ),
    (
        "post",
        "/api/health-rules/",
        {
            "name": "hot",
            "signal": "temperature_c",
            "test": "above",
            "threshold": 90,
            "verdict": "drain",
            "window": 60,
        },
        "window",
    ),
]


@pytest.mark.parametrize(("method", "path", "body", "field"), UNKNOWN_FIELD_WRITES)
def test_a_misspelt_field_is_a_400_naming_it_and_nothing_is_written(
    fleet, submitter, operator_client, method, path, body, field
):
    before = AuditEvent.objects.count()
    response = getattr(operator_client, method)(path.format(node=_node_id()), body, format="json")
    assert response.status_code == 400, response.content
    assert "unknown field; known fields:" in " ".join(response.json()[field])
    assert AuditEvent.objects.count() == before  # every write is audited: none happened
    assert not Quota.objects.exists() and not Action.objects.exists()


def test_a_misspelt_note_on_an_approval_is_a_400_and_the_action_waits(fragmented, operator_client):
    plan = plan_defrag(None).action
    assert plan is not None
    response = operator_client.post(f"/api/actions/{plan.id}/approve/", {"notes": "go"}, format="json")
    assert response.status_code == 400, response.content
    assert "unknown field" in " ".join(response.json()["notes"])
    plan.refresh_from_db()
    assert plan.state == ActionState.PROPOSED
