"""Failed-login limits (fleet.auth): a client that guesses one account's password
is refused for it, even with the right one; nobody is locked out by others'
failures (#28 item 11: five wrong passwords from one address refused every
other user, and 20 garbage tokens made a valid operator token get 429); the
username's failing clients back off; the admin's login counts the same way;
behind trusted proxies, each client is counted, not the proxy."""

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
    settings.RACKWISE_LOGIN_MAX_ADDRESS_FAILURES = 6
    addresses = ["127.0.0.1", "10.0.0.2", "10.0.0.3", "203.0.113.7", "203.0.113.8"]
    names = ["vic", "walt", "root", "x1", "x2", "x3", "x4", "x5", "x6"]
    keys = (
        [f"user:{n}" for n in names]
        + [f"ip:{a}" for a in addresses]
        + [f"pair:{n}:{a}" for n in names for a in addresses]
        + [f"last:user:{n}" for n in names]
    )
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


def test_wrong_passwords_for_one_user_lock_out_nobody_else_from_that_address(vic, db):
    """Behind a proxy every client shares an address: five wrong passwords for
    any username from it refused every other user's right password."""
    ensure_user(None, "walt", role="viewer", password=PASSWORD, issue_token=False)
    client = Client()
    for _ in range(5):
        _login(client, "vic", "guess")

    assert _login(Client(), "walt", PASSWORD).status_code == 302


def test_the_owner_at_another_address_logs_in_while_someone_guesses_their_password(vic):
    attacker = Client(REMOTE_ADDR="203.0.113.7")
    for _ in range(10):
        _login(attacker, "vic", "guess")

    assert _login(Client(REMOTE_ADDR="10.0.0.2"), "vic", PASSWORD).status_code == 302
    assert "Too many failed attempts" in _login(attacker, "vic", PASSWORD).content.decode()


def test_a_client_that_failed_backs_off_once_the_username_is_under_attack(vic):
    """The per-username delay: another client that has itself failed for the
    username waits a few seconds; it is not locked for the window."""
    for _ in range(4):
        _login(Client(REMOTE_ADDR="203.0.113.7"), "vic", "guess")
    other = Client(REMOTE_ADDR="10.0.0.3")
    _login(other, "vic", "typo")

    response = _login(other, "vic", PASSWORD).content.decode()

    assert "Too many failed attempts for this username; try again in" in response


def test_spraying_many_usernames_from_one_address_refuses_that_address(vic, db):
    ensure_user(None, "walt", role="viewer", password=PASSWORD, issue_token=False)
    client = Client(REMOTE_ADDR="203.0.113.8")
    for name in ("x1", "x2", "x3", "x4", "x5", "x6"):
        _login(client, name, "guess")

    assert "Too many failed attempts" in _login(client, "walt", PASSWORD).content.decode()
    assert _login(Client(REMOTE_ADDR="10.0.0.2"), "walt", PASSWORD).status_code == 302


def test_behind_a_trusted_proxy_each_client_is_counted_by_its_forwarded_address(vic, settings):
    settings.RACKWISE_NUM_PROXIES = 1
    proxy = "10.0.0.3"
    guessing = Client(REMOTE_ADDR=proxy, HTTP_X_FORWARDED_FOR="203.0.113.7")
    for _ in range(3):
        _login(guessing, "vic", "guess")

    owner = Client(REMOTE_ADDR=proxy, HTTP_X_FORWARDED_FOR="spoofed, 10.0.0.2")
    assert _login(owner, "vic", PASSWORD).status_code == 302
    assert "Too many failed attempts" in _login(guessing, "vic", PASSWORD).content.decode()


def test_the_admin_login_counts_failures_too(db, django_user_model):
    django_user_model.objects.create_superuser("root", "root@example.com", PASSWORD)
    client = Client()
    for _ in range(3):
        _login(client, "root", "wrong-password", "/admin/login/")

    response = _login(client, "root", PASSWORD, "/admin/login/")

    assert response.status_code == 200
    assert "Too many failed attempts" in response.content.decode()


def test_wrong_api_tokens_slow_down_their_client_and_never_a_right_token(fleet, db):
    _, token = ensure_user(None, "vic", role="viewer")
    client = APIClient()
    for i in range(3):
        client.credentials(HTTP_AUTHORIZATION=f"Token wrong-{i}")
        client.get("/api/me/")

    client.credentials(HTTP_AUTHORIZATION="Token wrong-again")
    slowed = client.get("/api/me/")
    assert slowed.status_code == 429 and int(slowed["Retry-After"]) >= 1

    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get("/api/me/").status_code == 200
