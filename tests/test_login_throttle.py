"""Failed-login limits: after too many wrong passwords for a username (or from an
address) within the window, the login is refused even with the right password;
the admin's login counts the same way; wrong API tokens lock an address out."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from fleet.auth import login_limiter, token_limiter
from fleet.services.users import ensure_user

PASSWORD = "correct-horse-battery"


@pytest.fixture(autouse=True)
def limits(settings):
    settings.RACKWISE_LOGIN_MAX_FAILURES = 3
    settings.RACKWISE_TOKEN_MAX_FAILURES = 3
    keys = ["user:vic", "user:walt", "user:root", "ip:127.0.0.1", "ip:10.0.0.2"]
    # Only this test's counters: the cache shares Redis with Celery and Channels.
    login_limiter().reset(keys)
    token_limiter().reset(keys)
    yield
    login_limiter().reset(keys)
    token_limiter().reset(keys)


@pytest.fixture
def vic(db):
    return ensure_user(None, "vic", role="viewer", password=PASSWORD, issue_token=False)[0]


def _login(client: Client, username: str, password: str, path: str = "/login/"):
    return client.post(path, {"username": username, "password": password})


def test_it_refuses_the_right_password_after_too_many_wrong_ones(vic):
    client = Client()
    for _ in range(3):
        assert _login(client, "vic", "wrong-password").status_code == 200

    response = _login(client, "vic", PASSWORD)

    assert response.status_code == 200  # the form again, not the redirect of a login
    assert "Too many failed attempts" in response.content.decode()
    assert "_auth_user_id" not in client.session


def test_the_right_password_before_the_limit_logs_in_and_forgives_the_username(vic):
    for address in ("127.0.0.1", "10.0.0.2"):  # a fresh address: only the username's count is at stake
        client = Client(REMOTE_ADDR=address)
        for _ in range(2):
            _login(client, "vic", "wrong-password")

        assert _login(client, "vic", PASSWORD).status_code == 302


def test_failures_for_other_usernames_from_one_address_lock_that_address_out(vic, db):
    ensure_user(None, "walt", role="viewer", password=PASSWORD, issue_token=False)
    client = Client()
    for name in ("x1", "x2", "x3"):
        _login(client, name, "guess")

    response = _login(client, "walt", PASSWORD)

    assert "Too many failed attempts" in response.content.decode()


def test_the_admin_login_counts_failures_too(db, django_user_model):
    django_user_model.objects.create_superuser("root", "root@example.com", PASSWORD)
    client = Client()
    for _ in range(3):
        _login(client, "root", "wrong-password", "/admin/login/")

    response = _login(client, "root", PASSWORD, "/admin/login/")

    assert response.status_code == 200
    assert "Too many failed attempts" in response.content.decode()


def test_wrong_api_tokens_lock_the_address_out_even_for_a_right_token(fleet, db):
    _, token = ensure_user(None, "vic", role="viewer")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get("/api/me/").status_code == 200
    for i in range(3):
        client.credentials(HTTP_AUTHORIZATION=f"Token wrong-{i}")
        assert client.get("/api/me/").status_code == 401

    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    response = client.get("/api/me/")

    assert response.status_code == 429
    assert int(response["Retry-After"]) >= 1
