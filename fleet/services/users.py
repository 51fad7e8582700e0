"""Users, roles (Django groups) and API tokens.

API tokens are django-rest-knox tokens: only a hash is stored, so a token is
shown once, when it is issued, and may carry an expiry."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from knox.models import AuthToken

from fleet.choices import Role
from fleet.models import Tenant
from fleet.services import audit
from fleet.services.errors import InvalidInput

# The longest expiry a token can be issued with (about 100 years): beyond it the
# date overflows, and "never" is spelt by leaving the expiry out.
MAX_TOKEN_DAYS = 36500


def ensure_user(
    actor,
    username: str,
    *,
    role: str,
    tenants: list[str] | None = None,
    password: str | None = None,
    issue_token: bool = True,
    token_expires_days: int | None = None,
) -> tuple[object, str | None]:
    """Create or update a user with exactly one Rackwise role and the given
    tenants (created if missing). Operators are staff (they may open /admin/);
    other roles are not. Returns the user and, with ``issue_token``, a new API
    token (its only plain-text copy; earlier tokens stay valid)."""
    if role not in Role.values:
        raise InvalidInput({"role": [f"unknown role {role!r}; use one of: {', '.join(Role.values)}"]})
    if not username or not username.strip():
        raise InvalidInput({"username": ["a username is required"]})
    if token_expires_days is not None and not 1 <= token_expires_days <= MAX_TOKEN_DAYS:
        raise InvalidInput({"expires_days": [f"must be between 1 and {MAX_TOKEN_DAYS} days"]})
    User = get_user_model()
    with transaction.atomic():
        user, created = User.objects.get_or_create(username=username)
        if password is not None:
            user.set_password(password)
        elif created:
            user.set_unusable_password()
        # The roles table: operators administer (admin site); superusers stay staff.
        user.is_staff = role == Role.OPERATOR or user.is_superuser
        user.save()
        role_groups = [Group.objects.get_or_create(name=r)[0] for r in Role.values]
        user.groups.remove(*role_groups)
        user.groups.add(Group.objects.get(name=role))
        for name in tenants or []:
            Tenant.objects.get_or_create(name=name)[0].members.add(user)
        if role == Role.SUBMITTER and not user.tenants.exists():
            # A submitter without a tenant could submit nothing ("you belong to no
            # tenant"); refuse to make one (the transaction undoes the user).
            raise InvalidInput({"tenant": ["a submitter must belong to a tenant; give one (--tenant NAME)"]})
        token = None
        if issue_token:
            expiry = timedelta(days=token_expires_days) if token_expires_days else None
            _, token = AuthToken.objects.create(user=user, expiry=expiry)
        audit.record(
            actor,
            "user.create" if created else "user.update",
            user,
            after={"role": role, "tenants": sorted(tenants or []), "token_expires_days": token_expires_days}
            if issue_token
            else {"role": role, "tenants": sorted(tenants or [])},
        )
    return user, token
