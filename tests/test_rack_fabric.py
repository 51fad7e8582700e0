"""The rack as a failure domain (issue #31): a rack whose nodes report NVLink
fabric trouble is degraded, gets no new multi-node gangs, and tops the
attention view; one node alone does not degrade it; it clears when none does."""

from __future__ import annotations

import pytest

from fleet.models import AuditEvent, Job, Rack
from fleet.services.decisions.scheduling import schedule_pass
from fleet.services.jobs.submit import JobSpec, submit_job
from tests.signals_support import send_beat

pytestmark = pytest.mark.django_db


@pytest.fixture
def beat(fleet, django_capture_on_commit_callbacks):
    """beat(hostname, **imex or signal changes): that node's agent reports."""

    def send(hostname: str, imex: str = "ready", **changes) -> None:
        with django_capture_on_commit_callbacks(execute=True):
            send_beat(hostname, imex, **changes)

    return send


def _racks(job: Job) -> set[str]:
    return set(
        job.allocations.filter(released_at__isnull=True).values_list("gpu__node__rack__name", flat=True)
    )


def test_a_rack_whose_nodes_report_fabric_trouble_gets_no_new_gangs_and_tops_attention(
    beat, submitter, viewer_client
):
    beat("r1-n00", imex="unavailable")
    assert Rack.objects.get(name="r1").fabric_degraded == "", "one node alone: its own trouble"
    beat("r1-n01", fabric__health_mask=2)
    r1 = Rack.objects.get(name="r1")
    assert r1.fabric_degraded == (
        "NVLink fabric degraded on 2 of 18 nodes (r1-n00: IMEX unavailable (no quorum); "
        "r1-n01: GPU 0 fabric health mask 0x2; GPU 1 fabric health mask 0x2; "
        "GPU 2 fabric health mask 0x2; GPU 3 fabric health mask 0x2)"
    )
    assert AuditEvent.objects.filter(action="rack.fabric", object_id=str(r1.pk)).count() == 1
    attention = viewer_client.get("/api/attention/").json()
    assert attention["items"][0]["key"] == "racks_degraded"
    assert attention["items"][0]["text"].startswith("1 rack with a degraded NVLink fabric (r1)")
    assert viewer_client.get(f"/api/racks/{r1.pk}/").json()["fabric_degraded"] == r1.fabric_degraded

    # Within one pass: gangs go to r2 only; one-node work may still use r1.
    gangs = [
        submit_job(
            submitter, JobSpec(name=f"g{i}", tenant="llm", num_nodes=8, gpus_per_node=4, locality="required")
        )
        for i in range(3)
    ]
    schedule_pass()
    placed = [g for g in gangs if _racks(g)]
    assert len(placed) == 2 and all(_racks(g) == {"r2"} for g in placed)
    waiting = next(g for g in gangs if not _racks(g))
    waiting.refresh_from_db()
    assert "gangs are kept off r1 (NVLink fabric degraded)" in waiting.state_reason

    # Healthy again once no node reports trouble.
    beat("r1-n00")
    assert Rack.objects.get(name="r1").fabric_degraded == (
        "NVLink fabric degraded on 1 of 18 nodes (r1-n01: GPU 0 fabric health mask 0x2; "
        "GPU 1 fabric health mask 0x2; GPU 2 fabric health mask 0x2; GPU 3 fabric health mask 0x2); "
        "it stays degraded until no node reports trouble"
    ), "one node still in trouble: still degraded, naming only that node"
    beat("r1-n01")
    assert Rack.objects.get(name="r1").fabric_degraded == ""
    schedule_pass()
    waiting.refresh_from_db()
    assert _racks(waiting) == {"r1"}
