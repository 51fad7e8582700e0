"""Keep the open live-feed sockets in step with who may see what: a logout
closes the session's sockets, and a change to a user's role (groups), tenants,
active flag or the user's deletion has that user's sockets re-check their access
(fleet.consumers). Connected in FleetConfig.ready; each message goes out once
the change commits."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_out
from django.db import transaction
from django.db.models.signals import m2m_changed, post_delete, post_save

from fleet.events import session_group, tell_sockets, user_group


def _tell_users(user_ids) -> None:
    for user_id in set(user_ids):
        transaction.on_commit(lambda u=user_id: tell_sockets(user_group(u), "access.changed"), robust=True)


def _logged_out(sender, request=None, **kwargs) -> None:
    key = getattr(getattr(request, "session", None), "session_key", None)
    if key:
        transaction.on_commit(lambda: tell_sockets(session_group(key), "session.ended"), robust=True)


def _membership_changed(sender, instance, action, reverse, pk_set, **kwargs) -> None:
    """User.groups (roles) and Tenant.members: ``instance`` is the user when the
    change is made from the user's side, else the group or tenant."""
    User = get_user_model()
    if action == "pre_clear" and not isinstance(instance, User):
        # Who is about to lose it: gone from the table by the time post_clear runs.
        members = instance.user_set if hasattr(instance, "user_set") else instance.members
        _tell_users(members.values_list("pk", flat=True))
    elif action in ("post_add", "post_remove", "post_clear"):
        _tell_users([instance.pk] if isinstance(instance, User) else (pk_set or ()))


def _user_saved_or_deleted(sender, instance, update_fields=None, **kwargs) -> None:
    if update_fields is not None and set(update_fields) <= {"last_login", "password"}:
        return  # a login (or a password change, which ends sessions itself): access is the same
    _tell_users([instance.pk])


def connect() -> None:
    from fleet.models import Tenant  # connected from AppConfig.ready(): models load after this module

    User = get_user_model()
    user_logged_out.connect(_logged_out, dispatch_uid="rackwise-sockets-logout")
    for through in (User.groups.through, Tenant.members.through):
        m2m_changed.connect(
            _membership_changed, sender=through, dispatch_uid=f"rackwise-sockets-{through.__name__}"
        )
    post_save.connect(_user_saved_or_deleted, sender=User, dispatch_uid="rackwise-sockets-user-saved")
    post_delete.connect(_user_saved_or_deleted, sender=User, dispatch_uid="rackwise-sockets-user-deleted")
