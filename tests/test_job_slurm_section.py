"""A job's ``slurm`` section (how Slurm runs it): accepted, stored, shown
without environment values, and every malformed section refused with a field
message and nothing written."""

from __future__ import annotations

import pytest

from fleet.models import AuditEvent, Job

URL = "/api/jobs/"
GANG = {"name": "train", "num_nodes": 4, "gpus_per_node": 4}


def submit(client, **data):
    return client.post(URL, {**GANG, **data}, format="json")


def refused(response, *path: str) -> str:
    assert response.status_code == 400, response.content
    errors = response.json()
    field = ".".join(path)
    assert field in errors, f"expected an error on {field}, got {errors}"
    body = errors[field]
    assert Job.objects.count() == 0
    assert not AuditEvent.objects.filter(object_type="job").exists()
    return " ".join(body) if isinstance(body, list) else str(body)


def test_a_script_is_stored_and_shown_without_env_values(fleet, submitter_client):
    spec = {
        "script": "#!/bin/bash\nsrun hostname\n",
        "partition": "gpu",
        "account": "vision",
        "time_limit_min": 90,
        "env": {"WANDB_API_KEY": "secret-value", "NCCL_DEBUG": "INFO"},
    }
    response = submit(submitter_client, slurm=spec)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["slurm"] == {
        "script": spec["script"],
        "partition": "gpu",
        "account": "vision",
        "time_limit_min": 90,
        "env_names": ["NCCL_DEBUG", "WANDB_API_KEY"],
    }
    assert "secret-value" not in response.content.decode()
    job = Job.objects.get(pk=body["id"])
    assert job.cluster_spec == {"slurm": spec}
    assert body["external_id"] is None


def test_a_job_without_a_slurm_section_has_none(fleet, submitter_client):
    response = submit(submitter_client)
    assert response.status_code == 201
    assert response.json()["slurm"] is None
    assert Job.objects.get().cluster_spec == {}


@pytest.mark.parametrize(
    ("spec", "field", "fragment"),
    [
        ({}, "script", "either script or command"),
        ({"script": "#!/bin/sh\ntrue", "command": "true"}, "script", "either script or command"),
        ({"script": "srun hostname"}, "script", "must start with #!"),
        ({"command": "   "}, "command", "blank"),
        ({"command": "echo \x00"}, "command", "Null characters"),
        ({"command": "true", "partition": "gpu; rm -rf /"}, "partition", "1-64 of"),
        ({"command": "true", "account": ""}, "account", "may not be blank"),
        ({"command": "true", "time_limit_min": 0}, "time_limit_min", "greater than or equal to 1"),
        ({"command": "true", "time_limit_min": 10**9}, "time_limit_min", "less than or equal to"),
        ({"command": "true", "env": {"1BAD": "x"}}, "env", "not a variable name: 1BAD"),
        ({"command": "true", "env": {f"V{i}": "x" for i in range(101)}}, "env", "at most 100"),
        ({"command": "true", "env": ["A=1"]}, "env", "dictionary"),
        ({"script": "#!/bin/bash\n" + "x" * 100_000}, "script", "no more than 100000"),
    ],
)
def test_malformed_sections_are_refused(fleet, submitter_client, spec, field, fragment):
    text = refused(submit(submitter_client, slurm=spec), "slurm", field)
    assert fragment in text, text


def test_a_slurm_fleet_requires_the_section(fleet, submitter_client, settings):
    settings.RACKWISE_CLUSTER = "slurm"
    text = refused(submit(submitter_client), "slurm")
    assert "this fleet runs on Slurm" in text
    assert submit(submitter_client, slurm={"command": "python train.py"}).status_code == 201


def test_the_section_counts_in_the_idempotency_digest(fleet, submitter_client):
    first = submit(submitter_client, slurm={"command": "a"}, idempotency_key="k1")
    assert first.status_code == 201
    again = submit(submitter_client, slurm={"command": "a"}, idempotency_key="k1")
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    other = submit(submitter_client, slurm={"command": "b"}, idempotency_key="k1")
    assert other.status_code == 409
