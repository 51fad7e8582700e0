"""The Django admin: every page loads for a superuser, and admin actions go
through the services (audited), turning refusals into warnings."""

from __future__ import annotations

import pytest
from django.contrib import admin, messages
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse
from django.utils.html import escape

from fleet.models import GPU, Allocation, AuditEvent, Job, Node, Rack, Tenant
from fleet.services.jobs import allocations as job_allocations
from fleet.services.jobs import submit as job_services
from fleet.services.nodes import moves as node_services

FLEET_MODELS = [Rack, Node, GPU, Tenant, Job, Allocation, AuditEvent]


@pytest.fixture
def superuser(db, django_user_model):
    return django_user_model.objects.create_superuser("root", "root@example.com", "root-password-123")


@pytest.fixture
def admin_client(superuser) -> Client:
    client = Client()
    client.force_login(superuser)
    return client


@pytest.fixture
def populated(fleet, submitter, operator):
    """At least one row of every fleet model: a placed job holds allocations."""
    job = job_services.submit_job(submitter, job_services.JobSpec(name="admin-job", num_gpus=4))
    node = fleet[0].nodes.get(slot=0)
    job_allocations.apply_placement(None, job.pk, {node.id: [0, 1, 2, 3]}, reason="test")
    node_services.drain_node(operator, fleet[0].nodes.get(slot=1).pk, "maintenance")
    return job


def admin_url(model, view: str, *args) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


def action(client, model, name: str, objects) -> object:
    return client.post(
        admin_url(model, "changelist"),
        {"action": name, "_selected_action": [obj.pk for obj in objects], "index": 0},
    )


def warnings_and_successes(response) -> tuple[list[str], list[str]]:
    found = list(get_messages(response.wsgi_request))
    return (
        [m.message for m in found if m.level == messages.WARNING],
        [m.message for m in found if m.level == messages.SUCCESS],
    )


def test_every_fleet_model_is_registered_in_the_admin():
    assert set(FLEET_MODELS) <= set(admin.site._registry)


@pytest.mark.parametrize("model", FLEET_MODELS, ids=lambda m: m.__name__)
def test_the_changelist_and_change_page_of_each_fleet_model_load(populated, admin_client, model):
    obj = model.objects.first()
    assert obj is not None

    changelist = admin_client.get(admin_url(model, "changelist"))
    change = admin_client.get(admin_url(model, "change", obj.pk))

    assert changelist.status_code == 200
    assert change.status_code == 200
    assert escape(str(obj)) in change.content.decode()


def test_every_registered_admin_page_loads(populated, admin_client):
    for model in admin.site._registry:
        response = admin_client.get(admin_url(model, "changelist"))
        assert response.status_code == 200, model
        obj = model.objects.first()
        if obj is not None:
            assert admin_client.get(admin_url(model, "change", obj.pk)).status_code == 200, model


@pytest.mark.parametrize("model", [Rack, Node, GPU, Tenant], ids=lambda m: m.__name__)
def test_the_add_page_of_each_editable_model_loads(populated, admin_client, model):
    assert admin_client.get(admin_url(model, "add")).status_code == 200


@pytest.mark.parametrize("model", [Job, Allocation, AuditEvent], ids=lambda m: m.__name__)
def test_jobs_allocations_and_the_audit_log_cannot_be_added_in_the_admin(populated, admin_client, model):
    assert admin_client.get(admin_url(model, "add")).status_code == 403


def test_the_node_changelist_filters_and_searches(populated, admin_client):
    drained = admin_client.get(admin_url(Node, "changelist") + "?state__exact=drained")
    searched = admin_client.get(admin_url(Node, "changelist") + "?q=r2-n05")

    assert drained.status_code == 200
    assert "r1-n01" in drained.content.decode()
    assert "r1-n02" not in drained.content.decode()
    assert searched.status_code == 200
    assert "r2-n05" in searched.content.decode()
    assert "r1-n05" not in searched.content.decode()


def test_the_drain_action_goes_through_the_service_and_is_audited(fleet, superuser, admin_client):
    node = fleet[1].nodes.get(slot=4)
    version = Rack.objects.get(pk=node.rack_id).version

    response = action(admin_client, Node, "drain", [node])

    assert response.status_code == 302
    warnings, successes = warnings_and_successes(response)
    assert successes == ["Drained: 1"]
    assert warnings == []
    node.refresh_from_db()
    assert (node.state, node.state_reason) == ("drained", "drained by operator")
    assert Rack.objects.get(pk=node.rack_id).version == version + 1
    event = AuditEvent.objects.get(action="node.drain", object_id=str(node.pk))
    assert event.actor == superuser
    assert event.actor_name == "root"


def test_a_conflicting_admin_action_shows_a_warning_instead_of_crashing(populated, admin_client):
    drained = Node.objects.get(hostname="r1-n01")
    healthy = Node.objects.get(hostname="r1-n02")
    events = AuditEvent.objects.filter(action="node.drain").count()

    response = action(admin_client, Node, "drain", [drained, healthy])

    assert response.status_code == 302
    warnings, successes = warnings_and_successes(response)
    assert successes == ["Drained: 1"]
    assert warnings == ["node r1-n01 is drained; only a healthy or suspect node can be drained"]
    drained.refresh_from_db()
    healthy.refresh_from_db()
    assert drained.state_reason == "maintenance"
    assert healthy.state == "drained"
    assert AuditEvent.objects.filter(action="node.drain").count() == events + 1


def test_a_refused_action_alone_changes_nothing(populated, admin_client):
    healthy = Node.objects.get(hostname="r2-n00")

    response = action(admin_client, Node, "undrain", [healthy])

    warnings, successes = warnings_and_successes(response)
    assert successes == []
    assert warnings == ["node r2-n00 is healthy; only a draining or drained node can be undrained"]
    healthy.refresh_from_db()
    assert healthy.state == "healthy"
    assert not AuditEvent.objects.filter(action="node.undrain").exists()


def test_the_mark_failed_and_return_actions_use_the_services(populated, admin_client):
    node = Node.objects.get(hostname="r1-n00")  # holds the placed job

    action(admin_client, Node, "mark_failed", [node])
    node.refresh_from_db()
    populated.refresh_from_db()
    assert node.state == "failed"
    assert populated.state == "recovering"

    action(admin_client, Node, "return_to_service", [node])
    node.refresh_from_db()
    assert node.state == "healthy"
    assert (
        AuditEvent.objects.filter(action__in=["node.fail", "node.return"], object_id=str(node.pk)).count()
        == 2
    )


def test_the_job_cancel_action_cancels_and_warns_about_finished_jobs(populated, submitter, admin_client):
    done = job_services.submit_job(submitter, job_services.JobSpec(name="done", num_gpus=1))
    job_services.cancel_job(None, done.pk)

    response = action(admin_client, Job, "cancel", [populated, done])

    warnings, successes = warnings_and_successes(response)
    assert successes == ["Cancelled: 1"]
    assert len(warnings) == 1
    assert f"job #{done.pk} is already cancelled" in warnings[0]
    populated.refresh_from_db()
    assert populated.state == "cancelled"
    assert not Allocation.objects.filter(job=populated, released_at__isnull=True).exists()


def test_creating_a_tenant_in_the_admin_is_audited(db, superuser, admin_client):
    response = admin_client.post(admin_url(Tenant, "add"), {"name": "robotics", "members": []})

    assert response.status_code == 302, response.content
    tenant = Tenant.objects.get(name="robotics")
    event = AuditEvent.objects.get(action="tenant.create")
    assert event.object_id == str(tenant.pk)
    assert event.actor == superuser
    assert event.after["name"] == "robotics"


def test_a_gpu_saved_in_the_admin_repaints_its_rack_but_its_health_is_not_editable(fleet, admin_client):
    gpu = GPU.objects.get(node__hostname="r2-n05", index=3)
    version = Rack.objects.get(pk=fleet[1].pk).version

    response = admin_client.post(
        admin_url(GPU, "change", gpu.pk),
        {"node": gpu.node_id, "index": 3, "uuid": str(gpu.uuid), "health": "failed"},
    )

    assert response.status_code == 302, response.content
    gpu.refresh_from_db()
    assert gpu.health == "ok"  # health comes from the agents, through the health service
    assert Rack.objects.get(pk=fleet[1].pk).version == version + 1
    assert AuditEvent.objects.filter(action="gpu.change", object_id=str(gpu.pk)).exists()


def test_a_racks_shape_is_read_only_in_the_admin_once_it_exists(fleet, admin_client):
    page = admin_client.get(admin_url(Rack, "change", fleet[0].pk)).content.decode()

    assert 'name="spare_nodes"' in page
    assert 'name="nodes_per_domain"' not in page
    assert 'name="gpus_per_node"' not in page
    assert 'name="nodes_per_domain"' in admin_client.get(admin_url(Rack, "add")).content.decode()
