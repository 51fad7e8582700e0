"""POST /api/jobs/what-if/: what would happen to a job submitted now, with the
submission's validation, and nothing written.

The ``fleet`` fixture is two NVL72 racks: 36 nodes x 4 GPUs, 18 nodes per rack."""

from __future__ import annotations

from fleet.choices import JobState
from fleet.models import Action, AuditEvent, Job, Node
from fleet.services.decisions.scheduling import schedule_pass
from fleet.services.jobs.allocations import apply_placement, start_job
from fleet.services.jobs.submit import JobSpec, submit_job

URL = "/api/jobs/what-if/"


def ask(client, **data):
    return client.post(URL, data, format="json")


def run_on(submitter, rack, nodes: int, *, hours: float | None, name: str = "busy") -> Job:
    """A running job on the first ``nodes`` nodes of ``rack``."""
    job = submit_job(
        submitter,
        JobSpec(
            name=name,
            num_nodes=nodes,
            gpus_per_node=4,
            tenant="llm",
            expected_duration_s=int(hours * 3600) if hours else None,
        ),
    )
    picked = Node.objects.filter(rack=rack).order_by("slot")[:nodes]
    apply_placement(None, job.pk, {n.pk: [0, 1, 2, 3] for n in picked}, reason="test setup")
    return start_job(None, job.pk)


def counts() -> tuple[int, int, int]:
    return Job.objects.count(), AuditEvent.objects.count(), Action.objects.count()


def test_a_job_that_fits_would_start_now_on_named_nodes(fleet, submitter, submitter_client):
    r1, _ = fleet
    run_on(submitter, r1, 2, hours=1)
    before = counts()
    response = ask(submitter_client, name="train", num_nodes=16, gpus_per_node=4, expected_duration_s=3600)

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["starts_now"] is True
    assert len(body["placement"]) == 16 and body["expected_start_in_s"] == 0
    assert body["summary"].startswith("would start now on r")
    assert "16 of 18 nodes" in body["summary"]
    assert counts() == before  # nothing submitted, audited or proposed


def test_a_job_that_waits_gets_the_largest_slice_and_an_expected_start(fleet, submitter, submitter_client):
    r1, r2 = fleet
    run_on(submitter, r1, 10, hours=2, name="a")
    run_on(submitter, r2, 10, hours=5, name="b")
    response = ask(submitter_client, name="big", num_nodes=14, gpus_per_node=4, expected_duration_s=3600)

    body = response.json()
    assert response.status_code == 200, response.content
    assert body["starts_now"] is False and body["placement"] == []
    assert body["largest_free_slice"] == 8 and body["largest_free_unit"] == "nodes"
    assert 2 * 3600 - 120 <= body["expected_start_in_s"] <= 2 * 3600  # when job a ends
    assert body["summary"] == "waits: the largest free slice is 8 nodes; expected start in about 2 h"


def test_the_queue_ahead_pushes_the_expected_start_back(fleet, submitter, submitter_client):
    r1, r2 = fleet
    run_on(submitter, r1, 10, hours=2, name="a")
    run_on(submitter, r2, 10, hours=5, name="b")
    submit_job(
        submitter,
        JobSpec(name="ahead", num_nodes=14, gpus_per_node=4, tenant="llm", expected_duration_s=3 * 3600),
    )
    body = ask(submitter_client, name="big", num_nodes=14, gpus_per_node=4, expected_duration_s=3600).json()

    assert body["jobs_ahead"] == 1
    # "ahead" takes r1 from 2 h to 5 h; b leaves r2 at 5 h too.
    assert 5 * 3600 - 120 <= body["expected_start_in_s"] <= 5 * 3600
    assert body["summary"].startswith("waits behind 1 waiting job(s): ")


def gang_ahead_holding_the_fleet(fleet, submitter) -> Job:
    """4 nodes of r1 busy for 2 h, and a 32-node gang (segments of 16) waiting for
    both racks: it holds r2, free now, for itself."""
    r1, _ = fleet
    run_on(submitter, r1, 4, hours=2, name="a")
    return submit_job(
        submitter,
        JobSpec(
            name="ahead",
            num_nodes=32,
            gpus_per_node=4,
            segment_nodes=16,
            tenant="llm",
            expected_duration_s=3 * 3600,
        ),
    )


def test_room_held_for_a_job_ahead_is_named_as_such(fleet, submitter, submitter_client):
    """A free rack held for a bigger gang ahead: the slice is enough, the queue is why."""
    gang_ahead_holding_the_fleet(fleet, submitter)
    # Longer than "a" has left: backfilled, it would delay "ahead"'s reservation.
    body = ask(
        submitter_client, name="big", num_nodes=14, gpus_per_node=4, expected_duration_s=4 * 3600
    ).json()

    assert body["starts_now"] is False and body["jobs_ahead"] == 1
    assert body["largest_free_slice"] >= 14
    assert body["summary"].startswith(
        f"waits behind 1 waiting job(s): the largest free slice is {body['largest_free_slice']} nodes, "
        "enough for it, but the jobs ahead of it come first; expected start in about"
    ), body["summary"]


def test_a_job_held_back_by_a_reservation_says_for_which_job(fleet, submitter, submitter_client):
    """The same hold, for a job submitted: its reason names the job the room is held
    for (it said "no rack offers 14 idle nodes beyond its spares", beside a free rack)."""
    ahead = gang_ahead_holding_the_fleet(fleet, submitter)
    big = submit_job(
        submitter,
        JobSpec(name="big", num_nodes=14, gpus_per_node=4, tenant="llm", expected_duration_s=4 * 3600),
    )
    schedule_pass()

    big.refresh_from_db()
    assert big.state == JobState.PENDING
    assert big.state_reason.startswith(
        f"the room it needs now is held for job {ahead.pk}, expected to start in "
    )
    assert big.state_reason.endswith("; it would still be running then")
    shown = submitter_client.get(f"/api/jobs/{big.pk}/").json()
    assert shown["state_reason"] == big.state_reason


def test_without_expected_durations_it_says_there_is_no_estimate(fleet, submitter, submitter_client):
    r1, r2 = fleet
    run_on(submitter, r1, 10, hours=None, name="a")
    run_on(submitter, r2, 10, hours=None, name="b")
    body = ask(submitter_client, name="big", num_nodes=14, gpus_per_node=4).json()

    assert body["starts_now"] is False and body["expected_start"] is None
    assert "no expected start" in body["summary"]


def test_a_refused_field_gets_the_submission_s_message(fleet, submitter_client):
    what_if = ask(submitter_client, name="huge", num_nodes=40, gpus_per_node=4)
    submitted = submitter_client.post(
        "/api/jobs/", {"name": "huge", "num_nodes": 40, "gpus_per_node": 4}, format="json"
    )

    assert what_if.status_code == submitted.status_code == 400
    assert what_if.json() == submitted.json()
    assert Job.objects.count() == 0


def test_viewers_and_outsiders_are_refused(fleet, viewer_client, outsider_client, anon_client):
    for client in (viewer_client, outsider_client):
        assert ask(client, name="x", num_gpus=4).status_code == 403
    assert ask(anon_client, name="x", num_gpus=4).status_code in (401, 403)


def test_an_operator_may_ask_for_any_tenant(fleet, submitter, operator_client):
    response = ask(operator_client, name="x", num_gpus=2, tenant="llm")
    assert response.status_code == 200, response.content
    assert response.json()["summary"].endswith("2 of its 4 GPUs")


def test_a_job_its_tenants_quota_holds_back_waits_on_the_quota_in_the_what_if(
    fleet, submitter, submitter_client, operator
):
    from fleet.services.tenants import quotas

    quotas.set_quotas(operator, "llm", [{"gpus_per_node": 4, "nominal_gpus": 32, "borrowing_limit_gpus": 0}])
    run_on(submitter, fleet[0], 8, hours=2)
    before = counts()
    answer = ask(submitter_client, name="more", num_nodes=2, gpus_per_node=4, tenant="llm")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["starts_now"] is False and body["placement"] == []
    assert body["quota"] == {
        "admitted": False,
        "reason": "llm holds 32 of 32 nominal GPUs and may borrow 0: this job's 8 GPUs would borrow 8",
    }
    assert body["summary"] == f"waits on its tenant's quota: {body['quota']['reason']}"
    # Within the quota the engine's answer stands, and says the quota admits it.
    assert counts() == before
    quotas.set_quotas(operator, "llm", [{"gpus_per_node": 4, "nominal_gpus": 64}])
    body = ask(submitter_client, name="more", num_nodes=2, gpus_per_node=4, tenant="llm").json()
    assert body["starts_now"] is True and body["quota"]["admitted"] is True
