"""The only writer of ``Quota`` and ``RackReservation`` rows and of a tenant's
cohort and weight.

Operators set them (console, API, admin); every change is audited
(``tenant.quota``, ``tenant.share``) and asks for a scheduling pass, since
admission reads them (:mod:`fleet.services.decisions.admission`)."""

from __future__ import annotations

from django.db import transaction
from django.db.models import Count, Sum

from fleet import dispatch
from fleet.choices import Role
from fleet.models import Quota, Rack, RackReservation, Tenant
from fleet.permissions import has_role
from fleet.services import audit
from fleet.services.errors import Conflict, InvalidInput, NotAllowed
from fleet.services.tenants.usage import capacity_by_shape

QUOTA_FIELDS = ("nominal_gpus", "borrowing_limit_gpus", "lending_limit_gpus")


def _require_operator(actor) -> None:
    if not has_role(actor, Role.OPERATOR):
        raise NotAllowed("only operators can change quotas and fair-share weights")


def _tenant(name: str) -> Tenant:
    tenant = Tenant.objects.filter(name=name).first()
    if tenant is None:
        known = ", ".join(Tenant.objects.values_list("name", flat=True)[:20]) or "none yet"
        raise InvalidInput({"tenant": [f"no tenant {name!r}; known tenants: {known}"]})
    return tenant


def _row(quota: Quota | None) -> dict | None:
    return None if quota is None else {f: getattr(quota, f) for f in QUOTA_FIELDS}


def set_quotas(
    actor, tenant_name: str, quotas: list[dict], reserved_racks: list[str] | None = None
) -> list[Quota]:
    """Replace the tenant's quotas with ``quotas`` (one dict per node shape:
    ``gpus_per_node``, ``nominal_gpus``, optional ``borrowing_limit_gpus`` and
    ``lending_limit_gpus``; an empty list removes them all). Every figure is
    bounded by the GPUs the fleet has of that shape outside spare nodes.

    ``reserved_racks`` (rack names; None: unchanged, empty: none) replaces the
    racks reserved for the tenant. Their GPUs outside spare nodes count towards
    its nominal quota of their shape, so that quota must hold them; a rack
    reserved for another tenant is a conflict."""
    _require_operator(actor)
    tenant = _tenant(tenant_name)
    capacity = capacity_by_shape()
    errors: dict[str, list[str]] = {}
    seen: set[int] = set()
    for i, q in enumerate(quotas):
        shape = q.get("gpus_per_node")
        if shape not in capacity:
            shapes = ", ".join(str(s) for s in sorted(capacity)) or "none (the fleet has no racks)"
            errors[f"quotas[{i}].gpus_per_node"] = [
                f"the fleet has no {shape}-GPU nodes; its shapes: {shapes}"
            ]
            continue
        if shape in seen:
            errors[f"quotas[{i}].gpus_per_node"] = [
                f"{shape}-GPU nodes are given twice; give each shape once"
            ]
        seen.add(shape)
        for field in QUOTA_FIELDS:
            value = q.get(field)
            if value is None and field != "nominal_gpus":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                errors[f"quotas[{i}].{field}"] = ["a whole number of GPUs, 0 or more"]
            elif value > capacity[shape]:
                errors[f"quotas[{i}].{field}"] = [
                    f"{value} GPUs is more than the fleet's {capacity[shape]} GPUs on {shape}-GPU nodes "
                    "(spare nodes not counted)"
                ]
    racks = _reservable(tenant, quotas, reserved_racks, errors)
    if errors:
        raise InvalidInput(errors)
    with transaction.atomic():
        # Quota writers one at a time: the sum of the nominal quotas below is
        # checked against rows no other writer is changing.
        list(Tenant.objects.select_for_update().order_by("pk").values_list("pk", flat=True))
        before = {q.gpus_per_node: _row(q) for q in Quota.objects.select_for_update().filter(tenant=tenant)}
        _check_guarantees(tenant, quotas, before, capacity)
        if racks is not None:
            _reserve(actor, tenant, racks)
        Quota.objects.filter(tenant=tenant).exclude(gpus_per_node__in=seen).delete()
        rows = []
        for q in quotas:
            row, _ = Quota.objects.update_or_create(
                tenant=tenant,
                gpus_per_node=q["gpus_per_node"],
                defaults={f: q.get(f) if f != "nominal_gpus" else q[f] for f in QUOTA_FIELDS},
            )
            rows.append(row)
        after = {r.gpus_per_node: _row(r) for r in rows}
        if before != after:
            audit.record(
                actor,
                "tenant.quota",
                tenant,
                before={str(k): v for k, v in sorted(before.items())},
                after={str(k): v for k, v in sorted(after.items())},
                message=describe(tenant.name, rows),
            )
            dispatch.schedule_soon()
    return rows


def _check_guarantees(tenant: Tenant, quotas: list[dict], before: dict, capacity: dict[int, int]) -> None:
    """Nominal quotas are guaranteed: on each node shape, all tenants' together
    may not promise more GPUs than the fleet has outside spare nodes. A change
    that does not raise an over-promised sum (the fleet lost racks since) is let
    through, so that an operator can always lower a quota."""
    others = dict(
        Quota.objects.exclude(tenant=tenant)
        .values("gpus_per_node")
        .annotate(gpus=Sum("nominal_gpus"))
        .values_list("gpus_per_node", "gpus")
    )
    for q in quotas:
        shape, nominal = q["gpus_per_node"], q["nominal_gpus"]
        promised = others.get(shape) or 0
        was = (before.get(shape) or {}).get("nominal_gpus", 0)
        if promised + nominal > capacity[shape] and nominal > was:
            room = max(0, capacity[shape] - promised)
            raise Conflict(
                f"{tenant.name}'s nominal quota of {nominal} GPUs on {shape}-GPU nodes would promise "
                f"{promised + nominal} GPUs of the fleet's {capacity[shape]} (spare nodes not counted; other "
                f"tenants' nominal quotas hold {promised}): give at most {room}, or lower another "
                "tenant's nominal quota first"
            )


def _reservable(
    tenant: Tenant, quotas: list[dict], names: list[str] | None, errors: dict[str, list[str]]
) -> list[Rack] | None:
    """The racks ``names`` asks to reserve for ``tenant``, checked (messages
    into ``errors``); None when the reservations are left as they are, in which
    case the quotas must still hold the racks reserved now."""
    if names is None:
        racks = [r.rack for r in RackReservation.objects.select_related("rack").filter(tenant=tenant)]
        field = "quotas"
    else:
        found = {r.name: r for r in Rack.objects.filter(name__in=names)}
        racks = []
        seen: set[str] = set()
        for i, name in enumerate(names):
            if name not in found:
                errors[f"reserved_racks[{i}]"] = [f"no rack {name!r}; GET /api/racks/ lists them"]
            elif name in seen:
                errors[f"reserved_racks[{i}]"] = [f"rack {name!r} is given twice"]
            else:
                racks.append(found[name])
            seen.add(name)
        field = "reserved_racks"
    need: dict[int, int] = {}
    nodes = dict(
        Rack.objects.filter(pk__in=[r.pk for r in racks]).annotate(n=Count("nodes")).values_list("pk", "n")
    )
    for rack in racks:
        usable = max(0, nodes.get(rack.pk, 0) - rack.spare_nodes) * rack.gpus_per_node
        need[rack.gpus_per_node] = need.get(rack.gpus_per_node, 0) + usable
    nominal = {q.get("gpus_per_node"): q.get("nominal_gpus") for q in quotas}
    for shape, gpus in sorted(need.items()):
        have = nominal.get(shape)
        if not isinstance(have, int) or have < gpus:
            errors.setdefault(field, []).append(
                f"the reserved racks hold {gpus} GPUs on {shape}-GPU nodes (spare nodes not counted) and "
                f"count towards the nominal quota, which is {have or 0}: give a nominal quota of at least "
                f"{gpus} on {shape}-GPU nodes, or reserve fewer racks"
            )
    return None if names is None else racks


def _reserve(actor, tenant: Tenant, racks: list[Rack]) -> None:
    """Make ``racks`` the racks reserved for ``tenant`` (inside the caller's
    transaction), audited as ``tenant.reserved_racks``."""
    taken = (
        RackReservation.objects.select_for_update()
        .filter(rack__in=racks)
        .exclude(tenant=tenant)
        .select_related("rack", "tenant")
        .first()
    )
    if taken is not None:
        raise Conflict(
            f"rack {taken.rack.name} is reserved for {taken.tenant.name}; "
            f"remove it from {taken.tenant.name}'s reserved racks first"
        )
    mine = RackReservation.objects.select_for_update().filter(tenant=tenant)
    before = sorted(mine.values_list("rack__name", flat=True))
    after = sorted(r.name for r in racks)
    if before == after:
        return
    mine.exclude(rack__in=racks).delete()
    for rack in racks:
        RackReservation.objects.get_or_create(rack=rack, defaults={"tenant": tenant})
    audit.record(
        actor,
        "tenant.reserved_racks",
        tenant,
        before={"racks": before},
        after={"racks": after},
        message=f"{tenant.name}: racks reserved " + (", ".join(after) if after else "none"),
    )
    dispatch.schedule_soon()


def set_share(actor, tenant_name: str, *, weight: float | None = None, cohort: str | None = None) -> Tenant:
    """Change the tenant's fair-share weight and/or cohort."""
    _require_operator(actor)
    errors: dict[str, list[str]] = {}
    if weight is not None and not 0.01 <= weight <= 1000:
        errors["weight"] = ["a weight between 0.01 and 1000 (1 is an equal share)"]
    if cohort is not None and not cohort.replace("-", "").replace("_", "").isalnum():
        errors["cohort"] = ["a cohort name of letters, digits, '-' and '_'"]
    if errors:
        raise InvalidInput(errors)
    with transaction.atomic():
        tenant = Tenant.objects.select_for_update().get(pk=_tenant(tenant_name).pk)
        before = {"weight": tenant.weight, "cohort": tenant.cohort}
        if weight is not None:
            tenant.weight = weight
        if cohort is not None:
            tenant.cohort = cohort[:100]
        after = {"weight": tenant.weight, "cohort": tenant.cohort}
        if before != after:
            tenant.save(update_fields=["weight", "cohort"])
            audit.record(actor, "tenant.share", tenant, before=before, after=after)
            dispatch.schedule_soon()
    return tenant


def describe(tenant: str, quotas: list[Quota]) -> str:
    if not quotas:
        return f"{tenant}: no quota (borrows only)"
    parts = []
    for q in quotas:
        limits = []
        if q.borrowing_limit_gpus is not None:
            limits.append(f"borrows at most {q.borrowing_limit_gpus}")
        if q.lending_limit_gpus is not None:
            limits.append(f"lends at most {q.lending_limit_gpus}")
        parts.append(
            f"{q.nominal_gpus} GPUs on {q.gpus_per_node}-GPU nodes"
            + (f" ({', '.join(limits)})" if limits else "")
        )
    return f"{tenant}: " + "; ".join(parts)
