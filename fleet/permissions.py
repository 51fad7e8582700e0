"""One choke point for who may do what. Roles are Django groups named after
``Role`` values; a superuser is an operator. Views, the API and templates all ask
here."""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser
from django.db.models import Q, QuerySet
from rest_framework.permissions import SAFE_METHODS, BasePermission

from fleet.choices import Role
from fleet.models import Action, Job, Tenant

_RANK = {Role.VIEWER: 1, Role.SUBMITTER: 2, Role.OPERATOR: 3}


def role_of(user) -> Role | None:
    """The user's strongest role, or None for anonymous users and outsiders."""
    if user is None or isinstance(user, AnonymousUser) or not user.is_authenticated:
        return None
    if user.is_superuser:
        return Role.OPERATOR
    # Cached per request object: the same user is asked many times per response.
    cached = getattr(user, "_rackwise_role", "unset")
    if cached != "unset":
        return cached
    names = set(user.groups.values_list("name", flat=True))
    roles = [r for r in Role if r.value in names]
    role = max(roles, key=_RANK.__getitem__) if roles else None
    user._rackwise_role = role
    return role


def has_role(user, minimum: Role) -> bool:
    role = role_of(user)
    return role is not None and _RANK[role] >= _RANK[minimum]


def sees_all_tenants(user) -> bool:
    """Viewers and operators see every tenant's jobs; submitters only their own."""
    return role_of(user) in (Role.VIEWER, Role.OPERATOR)


def visible_jobs(user, queryset: QuerySet) -> QuerySet:
    if sees_all_tenants(user):
        return queryset
    if role_of(user) is None:
        return queryset.none()
    return queryset.filter(tenant__members=user)


def visible_tenant_names(user) -> list[str]:
    """The tenants a user's job filters offer: one entry per tenant that has a
    job the user may see, in name order (a query over jobs would repeat a
    tenant per job, since Job's default ordering enters the DISTINCT)."""

    job_tenants = visible_jobs(user, Job.objects.all()).order_by().values("tenant_id")
    return list(Tenant.objects.filter(pk__in=job_tenants).order_by("name").values_list("name", flat=True))


def tenant_ids_of(user) -> set[int] | None:
    """None when the user sees every tenant; else the ids of its tenants (what
    ``fleet.events.visible_to`` and ``fleet.redact.action_for`` take)."""
    return None if sees_all_tenants(user) else set(user.tenants.values_list("id", flat=True))


def visible_actions(user, queryset: QuerySet) -> QuerySet:
    """Viewers and operators see every action; a submitter those touching no job
    (drains: fleet-level, like racks) or at least one of its tenants' jobs.
    What it may read of a mixed one is ``fleet.redact.action_for``'s answer."""
    if sees_all_tenants(user):
        return queryset
    if role_of(user) is None:
        return queryset.none()

    mine = Action.objects.filter(Q(jobs__isnull=True) | Q(jobs__tenant__members=user)).values("pk")
    return queryset.filter(pk__in=mine)


def visible_audit_events(user, queryset: QuerySet) -> QuerySet:
    """Viewers and operators read the whole audit log; a submitter its own
    actions and its tenants' jobs' records."""
    if sees_all_tenants(user):
        return queryset

    job_ids = [str(pk) for pk in visible_jobs(user, Job.objects.all()).values_list("id", flat=True)]
    return queryset.filter(Q(actor=user) | Q(object_type="job", object_id__in=job_ids))


def may_cancel(user, job) -> bool:
    role = role_of(user)
    if role == Role.OPERATOR:
        return True
    return role == Role.SUBMITTER and job.tenant.members.filter(pk=user.pk).exists()


class HasRole(BasePermission):
    """DRF permission: reading needs any role; writing needs the role the view
    names for its action in ``write_roles`` (operator when not named)."""

    message = "You need a Rackwise role (viewer, submitter or operator) for this."

    def has_permission(self, request, view) -> bool:
        if request.method in SAFE_METHODS:
            return has_role(request.user, Role.VIEWER)
        action = getattr(view, "action", None)
        needed = getattr(view, "write_roles", {}).get(action, Role.OPERATOR)
        if not has_role(request.user, needed):
            self.message = f"This needs the {needed.label.lower()} role."
            return False
        return True


class IsOperator(BasePermission):
    """DRF permission: operators only, reads included (webhook configuration)."""

    message = "This needs the operator role."

    def has_permission(self, request, view) -> bool:
        return has_role(request.user, Role.OPERATOR)
