"""Operators open /admin/ (the README's roles table): ensure_user makes them
staff with the fleet's admin permissions, and takes that away with the role; a
migration makes existing operators staff."""

from __future__ import annotations

import importlib

from django.apps import apps
from django.test import Client

from fleet.services.users import ensure_user


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_an_operator_opens_the_admin_and_the_fleets_models(fleet, operator):
    client = _client(operator)

    assert operator.is_staff
    assert client.get("/admin/").status_code == 200
    assert client.get("/admin/fleet/rack/").status_code == 200
    assert client.get(f"/admin/fleet/rack/{fleet[0].pk}/change/").status_code == 200
    assert client.get("/admin/django_celery_beat/periodictask/").status_code == 200


def test_an_operator_cannot_edit_users_and_groups(operator):
    client = _client(operator)

    assert client.get("/admin/auth/user/").status_code == 403
    assert client.get("/admin/auth/group/").status_code == 403


def test_a_viewer_and_a_submitter_are_not_staff(viewer, submitter):
    assert not viewer.is_staff and not submitter.is_staff
    assert _client(viewer).get("/admin/").status_code == 302  # to the admin's login


def test_an_operator_made_a_viewer_loses_the_admin(db):
    user, _ = ensure_user(None, "ops", role="operator", issue_token=False)
    assert user.is_staff

    user, _ = ensure_user(None, "ops", role="viewer", issue_token=False)

    user.refresh_from_db()
    assert not user.is_staff
    assert _client(user).get("/admin/").status_code == 302


def test_the_migration_makes_existing_operators_staff(db, django_user_model):
    user, _ = ensure_user(None, "old-ops", role="operator", issue_token=False)
    viewer, _ = ensure_user(None, "old-viewer", role="viewer", issue_token=False)
    django_user_model.objects.filter(pk=user.pk).update(is_staff=False)

    importlib.import_module("fleet.migrations.0006_hardening").operators_are_staff(apps, None)

    user.refresh_from_db()
    viewer.refresh_from_db()
    assert user.is_staff and not viewer.is_staff
