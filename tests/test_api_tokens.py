"""API tokens (django-rest-knox): stored as a hash, optionally expiring, sent as
``Authorization: Token <key>``; tokens issued before the switch keep working."""

from __future__ import annotations

import hashlib
import importlib
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone
from knox.models import AuthToken
from rest_framework.test import APIClient

from fleet.services.users import ensure_user


def _me(token: str) -> int:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client.get("/api/me/").status_code


def test_it_stores_only_a_hash_of_the_token(db):
    _, token = ensure_user(None, "ci-bot", role="viewer")

    row = AuthToken.objects.get(user__username="ci-bot")
    assert token not in (row.digest, row.token_key)
    assert row.digest == hashlib.sha512(token.encode()).hexdigest()
    assert _me(token) == 200


def test_a_token_issued_with_an_expiry_stops_working_after_it(db):
    from io import StringIO

    out = StringIO()
    call_command("create_api_user", "ci-bot", "--role", "viewer", "--expires-days", "7", stdout=out)
    token = out.getvalue().strip()
    row = AuthToken.objects.get(user__username="ci-bot")
    assert timedelta(days=6, hours=23) < row.expiry - timezone.now() <= timedelta(days=7)
    assert _me(token) == 200

    AuthToken.objects.filter(pk=row.pk).update(expiry=timezone.now() - timedelta(seconds=1))

    assert _me(token) == 401


def test_a_token_without_expiry_never_expires(db):
    ensure_user(None, "ci-bot", role="viewer")

    assert AuthToken.objects.get(user__username="ci-bot").expiry is None


@pytest.mark.parametrize("days", ["0", "-1", "36501"])
def test_create_api_user_refuses_an_expiry_out_of_range(db, days):
    from django.core.management import CommandError

    with pytest.raises(CommandError, match="between 1 and 36500"):
        call_command("create_api_user", "ci-bot", "--role", "viewer", "--expires-days", days)


@pytest.mark.django_db(transaction=True)
def test_the_migration_hashes_old_plain_text_tokens_so_they_keep_working(fleet):
    """A database from before knox holds rest_framework.authtoken's table: the
    migration copies each key as a hash and drops the plain-text table."""
    user, _ = ensure_user(None, "old-bot", role="viewer", issue_token=False)
    old_key = "0123456789abcdef0123456789abcdef01234567"
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE authtoken_token "
            "(key varchar(40) PRIMARY KEY, created timestamptz NOT NULL, user_id int)"
        )
        cursor.execute(
            "INSERT INTO authtoken_token VALUES (%s, now() - interval '1 day', %s)", (old_key, user.pk)
        )
    migration = importlib.import_module("fleet.migrations.0006_hardening")
    from django.apps import apps

    with connection.schema_editor() as editor:
        migration.hash_plain_tokens(apps, editor)

    assert "authtoken_token" not in connection.introspection.table_names()
    assert _me(old_key) == 200
    assert AuthToken.objects.get(user=user).created < timezone.now() - timedelta(hours=23)


def test_a_bearer_token_is_taken_like_a_token(db):
    """#28 item 5: ``Bearer <token>`` got "credentials were not provided"."""
    _, token = ensure_user(None, "ci-bot", role="viewer")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert client.get("/api/me/").status_code == 200


@pytest.mark.parametrize("scheme", ["Bearer", "Token"])
def test_a_wrong_key_is_told_the_scheme_is_token(db, scheme):
    """#32: ``Bearer <wrong key>`` got a bare "Invalid token." that did not say
    the scheme is ``Token``."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"{scheme} not-a-key-of-ours")
    response = client.get("/api/me/")
    assert response.status_code == 401
    assert "The scheme is 'Token'" in response.json()["detail"]
    assert "send 'Authorization: Token <key>'" in response.json()["detail"]
    assert response["WWW-Authenticate"] == "Token"


def test_an_unknown_scheme_is_told_the_one_to_use(db):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Basic dXNlcjpwYXNz")
    response = client.get("/api/me/")
    assert response.status_code == 401
    assert "send 'Authorization: Token <key>'" in response.json()["detail"]
    assert "'Basic'" in response.json()["detail"]
