"""Management commands: seed_demo (idempotent demo fleet and users) and
create_api_user (a user with a role, and a token that works)."""

from __future__ import annotations

import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from fleet.models import GPU, AuditEvent, Node, Rack
from fleet.permissions import role_of

ROOT = Path(__file__).resolve().parent.parent

DEMO_USERS = {
    "operator": ("operator", {"llm", "vision"}),
    "viewer": ("viewer", set()),
    "submitter": ("submitter", {"llm"}),
    "vision-submitter": ("submitter", {"vision"}),
}


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_seed_demo_creates_the_demo_fleet_and_says_how_to_log_in(db):
    output = run("seed_demo")

    assert Rack.objects.count() == 8
    assert Node.objects.count() == 8 * 18
    assert GPU.objects.count() == 576
    assert "8 racks (8 new)" in output
    assert "http://127.0.0.1:8000/" in output
    assert "'rackwise-demo'" in output
    for username, (role, _) in DEMO_USERS.items():
        assert any(line.split()[:2] == [username, role] for line in output.splitlines()), username


def test_seed_demo_users_only_makes_no_racks(db):
    output = run("seed_demo", "--users-only")

    assert Rack.objects.count() == 0
    assert "0 racks (0 new)" in output
    assert get_user_model().objects.filter(username__in=list(DEMO_USERS)).count() == len(DEMO_USERS)


def test_seed_demo_gives_each_demo_user_their_role_tenants_and_password(db):
    run("seed_demo")

    for username, (role, tenants) in DEMO_USERS.items():
        user = get_user_model().objects.get(username=username)
        assert role_of(user) == role, username
        assert set(user.tenants.values_list("name", flat=True)) == tenants, username
        assert user.check_password("rackwise-demo"), username


def test_seed_demo_run_twice_changes_nothing(db):
    run("seed_demo")
    racks = list(Rack.objects.order_by("name").values_list("name", "external_id", "site", "row", "position"))

    output = run("seed_demo")

    assert "8 racks (0 new)" in output
    assert Rack.objects.count() == 8
    assert GPU.objects.count() == 576
    assert (
        list(Rack.objects.order_by("name").values_list("name", "external_id", "site", "row", "position"))
        == racks
    )
    assert AuditEvent.objects.filter(action="rack.create").count() == 8
    assert get_user_model().objects.filter(username__in=DEMO_USERS).count() == 4
    for username, (role, _) in DEMO_USERS.items():
        user = get_user_model().objects.get(username=username)
        assert user.groups.count() == 1
        assert role_of(user) == role


def test_seed_demo_places_the_racks_in_two_rows(db):
    run("seed_demo")

    assert set(Rack.objects.values_list("site", flat=True)) == {"demo-dc"}
    assert Rack.objects.filter(row="A").count() == 4
    assert Rack.objects.filter(row="B").count() == 4


@pytest.mark.parametrize(
    ("role", "tenants"),
    [("viewer", []), ("submitter", ["llm"]), ("operator", [])],
)
def test_create_api_user_prints_a_token_that_authenticates_with_that_role(db, role, tenants):
    args = ["create_api_user", "ci-bot", "--role", role]
    for tenant in tenants:
        args += ["--tenant", tenant]

    token = run(*args).strip()

    assert token and "\n" not in token
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    response = client.get("/api/me/")
    assert response.status_code == 200, response.content
    assert response.json() == {"username": "ci-bot", "role": role, "tenants": tenants}


def test_create_api_user_run_again_issues_another_token_and_replaces_the_role(db):
    first = run("create_api_user", "ci-bot", "--role", "viewer").strip()

    second = run("create_api_user", "ci-bot", "--role", "operator").strip()

    # Only hashes are stored, so the first token cannot be shown again; it stays valid.
    assert first != second
    user = get_user_model().objects.get(username="ci-bot")
    assert role_of(user) == "operator"
    assert list(user.groups.values_list("name", flat=True)) == ["operator"]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {second}")
    assert client.get("/api/me/").json()["role"] == "operator"
    client.credentials(HTTP_AUTHORIZATION=f"Token {first}")
    assert client.get("/api/me/").json()["role"] == "operator"


def test_a_wrong_token_does_not_authenticate(db):
    run("create_api_user", "ci-bot", "--role", "viewer")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")

    assert client.get("/api/me/").status_code == 401


def test_create_api_user_refuses_an_unknown_role(db):
    with pytest.raises(CommandError, match="invalid choice: 'wizard'"):
        run("create_api_user", "ci-bot", "--role", "wizard")

    assert not get_user_model().objects.filter(username="ci-bot").exists()


def test_create_api_user_refuses_a_blank_username(db):
    with pytest.raises(CommandError, match="a username is required"):
        run("create_api_user", " ", "--role", "viewer")

    assert not AuditEvent.objects.filter(action="user.create").exists()


def test_create_api_user_with_an_unknown_role_exits_non_zero_from_the_shell():
    result = subprocess.run(
        [sys.executable, "manage.py", "create_api_user", "ci-bot", "--role", "wizard"],
        cwd=ROOT,
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode != 0
    assert "invalid choice: 'wizard'" in result.stderr
    assert result.stdout == ""
