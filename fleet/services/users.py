"""Users, roles (Django groups) and API tokens."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from rest_framework.authtoken.models import Token

from fleet.choices import Role
from fleet.models import Tenant
from fleet.services import audit
from fleet.services.errors import InvalidInput


def ensure_user(
    actor,
    username: str,
    *,
    role: str,
    tenants: list[str] | None = None,
    password: str | None = None,
) -> tuple[object, Token]:
    """Create or update a user with exactly one Rackwise role and the given
    tenants (created if missing). Returns the user and their API token."""
    if role not in Role.values:
        raise InvalidInput({"role": [f"unknown role {role!r}; use one of: {', '.join(Role.values)}"]})
    if not username or not username.strip():
        raise InvalidInput({"username": ["a username is required"]})
    User = get_user_model()
    with transaction.atomic():
        user, created = User.objects.get_or_create(username=username)
        if password is not None:
            user.set_password(password)
        elif created:
            user.set_unusable_password()
        user.save()
        role_groups = [Group.objects.get_or_create(name=r)[0] for r in Role.values]
        user.groups.remove(*role_groups)
        user.groups.add(Group.objects.get(name=role))
        for name in tenants or []:
            Tenant.objects.get_or_create(name=name)[0].members.add(user)
        token, _ = Token.objects.get_or_create(user=user)
        audit.record(
            actor,
            "user.create" if created else "user.update",
            user,
            after={"role": role, "tenants": sorted(tenants or [])},
        )
    return user, token
